// The Group's Conversations this person may see (a restricted one is absent from their GroupState
// and its messages from their events) with their messages, and a reply that answers a question.
import type { Mesh } from "../mesh";
import { ConversationKind } from "../gen/missionweave/v1/conversation_pb";
import { commandDialog } from "../actions";
import { EAGER_SECTIONS, clear, h, lazyDetails, short, when } from "../ui";
import type { CheckedEvent } from "../verify";

export async function conversationsPanel(mesh: Mesh, root: HTMLElement, groupId: string, events: CheckedEvent[]): Promise<void> {
  const state = await mesh.groupState(groupId);
  const conversations = state?.conversations ?? [];
  const byConversation = new Map<string, CheckedEvent[]>();
  for (const c of events) {
    if (c.event.payload.case === "messagePosted") {
      const id = c.event.payload.value.conversationId;
      const list = byConversation.get(id);
      if (list) list.push(c);
      else byConversation.set(id, [c]);
    }
  }
  const answer = (conversationId: string, replyTo: string, question: string) => {
    const dialog = commandDialog(mesh, replyTo ? "Answer in the Conversation" : "Post to the Conversation", groupId, [{ name: "text", label: question ? `Your answer to: “${question.slice(0, 120)}”` : "Message", required: true, multiline: true }], (v) => ({
      case: "messagePost",
      value: { $typeName: "missionweave.v1.MessagePost", conversationId, messageId: "", content: { $typeName: "missionweave.v1.MessageContent", text: v["text"] ?? "", dataJson: "", artifacts: [], mentions: [] }, replyToMessageId: replyTo, topic: "" },
    }), () => undefined);
    document.body.append(dialog);
    dialog.showModal();
  };
  clear(
    root,
    h(
      "section",
      { class: "panel conversations", "aria-labelledby": "conv-title" },
      h("h2", { id: "conv-title" }, `Conversations (${conversations.length})`),
      ...conversations.map((conv) => {
        const messages = byConversation.get(conv.conversationId) ?? [];
        const post = h("button", { type: "button" }, "Post a message");
        post.addEventListener("click", () => answer(conv.conversationId, "", ""));
        const eager = conversations.length <= EAGER_SECTIONS;
        return lazyDetails(
          { class: "conversation", open: messages.length > 0 && messages.length < 20 && eager },
          `${conv.title || short(conv.conversationId)} · ${(ConversationKind[conv.kind] ?? "").replace(/^CONVERSATION_KIND_/, "").toLowerCase()}${conv.workItemId ? ` · ${conv.workItemId}` : ""}${conv.participantIds.length ? ` · restricted to ${conv.participantIds.join(", ")}` : ""} · ${conv.messageCount} messages`,
          () => [
            h(
              "ol",
              { class: "messages" },
              ...messages.slice(-100).map((c) => {
                const p = c.event.payload.case === "messagePosted" ? c.event.payload.value : null;
                const text = p?.content?.text ?? "";
                const reply = h("button", { type: "button", class: "link" }, "Answer");
                reply.addEventListener("click", () => answer(conv.conversationId, p?.messageId ?? "", text));
                return h("li", {}, h("strong", {}, c.event.actorId), ` ${when(c.event.recordedAt)}: `, text, p?.replyToMessageId ? h("span", { class: "sub" }, ` (reply to ${short(p.replyToMessageId)})`) : null, " ", reply);
              }),
            ),
            post,
          ],
          eager,
        );
      }),
    ),
  );
}
