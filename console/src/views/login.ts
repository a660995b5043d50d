// Sign-in: the person names their identity and picks their key file. The key is read in the page,
// used once to open a session and dropped; nothing of it is sent anywhere (docs/console.md).
import { h } from "../ui";
import type { Mesh } from "../mesh";

export function loginView(mesh: Mesh, done: () => void): HTMLElement {
  const identity = h("input", { id: "identity", name: "identity", autocomplete: "username", required: true, placeholder: "alice" });
  const file = h("input", { id: "keyfile", name: "keyfile", type: "file", required: true });
  const status = h("p", { class: "status", role: "status", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "card login", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Sign in to Mission control"),
    h("p", {}, "Your key file stays in this browser: it signs one session opening, then the page forgets it. Opening a session here ends your other sessions (the CLI's too)."),
    h("label", { for: "identity" }, "Identity"),
    identity,
    h("label", { for: "keyfile" }, "Key file (from ", h("code", {}, "mwp keygen"), ")"),
    file,
    h("button", { type: "submit" }, "Open session"),
    status,
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const picked = file.files?.[0];
    if (!picked || !identity.value.trim()) {
      status.textContent = "Name your identity and pick your key file.";
      return;
    }
    status.textContent = "Opening a session…";
    void picked
      .text()
      .then((text) => mesh.login(identity.value.trim(), text))
      .then(done)
      .catch((err: unknown) => {
        status.textContent = `Refused: ${err instanceof Error ? err.message : String(err)}`;
        status.classList.add("error");
      });
  });
  return h("main", { id: "main" }, form);
}
