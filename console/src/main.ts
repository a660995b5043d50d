// Mission control's entry: the session (restored from IndexedDB or opened at sign-in) and the
// hash routes: #/ (Missions and inbox), #/mission/<group id>.
import { forgetSession, loadSession } from "./keys";
import { Mesh } from "./mesh";
import { Refused } from "./rpc";
import { clear, h } from "./ui";
import { loginView } from "./views/login";
import { missionsView } from "./views/missions";
import { missionView } from "./views/mission";

let leave: (() => void) | null = null;

async function route(mesh: Mesh, app: HTMLElement): Promise<void> {
  leave?.();
  leave = null;
  if (!mesh.session) {
    clear(app, loginView(mesh, () => void route(mesh, app)));
    return;
  }
  const main = h("main", { id: "main", tabindex: -1 });
  const signOut = h("button", { type: "button", class: "link" }, "Sign out");
  signOut.addEventListener("click", () => {
    void forgetSession().then(() => {
      mesh.session = null;
      location.hash = "#/";
      void route(mesh, app);
    });
  });
  clear(
    app,
    h("a", { class: "skip", href: "#main" }, "Skip to content"),
    h(
      "header",
      { class: "top" },
      h("a", { href: "#/", class: "brand" }, "Mission control"),
      h("nav", { "aria-label": "Main" }, h("a", { href: "#/" }, "Missions")),
      h("span", { class: "who" }, `Signed in as ${mesh.session.identityId} (session ${mesh.session.sessionEpoch})`),
      signOut,
    ),
    main,
  );
  const hash = location.hash.replace(/^#/, "") || "/";
  try {
    const mission = /^\/mission\/([A-Za-z0-9._:-]+)/.exec(hash);
    if (mission?.[1]) leave = await missionView(mesh, main, mission[1]);
    else await missionsView(mesh, main);
  } catch (err) {
    if (err instanceof Refused && err.code === "UNAUTHENTICATED") {
      // A newer session (here or elsewhere) fenced this one: sign in again.
      await forgetSession();
      mesh.session = null;
      clear(app, loginView(mesh, () => void route(mesh, app)));
      return;
    }
    clear(main, h("h1", {}, "Refused"), h("p", { class: "error", role: "alert" }, err instanceof Error ? err.message : String(err)));
  }
}

async function start(): Promise<void> {
  const app = document.getElementById("app");
  if (!app) return;
  const mesh = await Mesh.connect();
  mesh.session = await loadSession();
  window.addEventListener("hashchange", () => void route(mesh, app));
  await route(mesh, app);
}

void start();
