// The Mission tree: this Mission, its parent and its child Missions (spec 14), each a link.
import { AuthorityService } from "../gen/missionweave/v1/authority_service_pb";
import type { Mesh } from "../mesh";
import { clear, h, missionStateName } from "../ui";

export async function treePanel(mesh: Mesh, root: HTMLElement, groupId: string): Promise<void> {
  const tree = await mesh.unary(AuthorityService.method.getMissionTree, { groupId }).catch(() => null);
  if (!tree || tree.nodes.length <= 1) {
    clear(root);
    return;
  }
  clear(
    root,
    h(
      "section",
      { class: "panel tree", "aria-labelledby": "tree-title" },
      h("h2", { id: "tree-title" }, "Mission tree"),
      h("ul", {}, ...tree.nodes.map((n) => {
        const li = h("li", {}, n.groupId === groupId ? h("strong", {}, n.title) : h("a", { href: `#/mission/${n.groupId}` }, n.title || n.missionId), ` — ${missionStateName(n.state)}`);
        li.style.marginLeft = `${n.depth * 1.5}em`; // CSSOM, which the page's CSP allows (style attributes it does not)
        return li;
      })),
    ),
  );
}
