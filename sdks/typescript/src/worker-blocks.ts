/**
 * The `blocked` outcome (missionweave/sdk/worker.py `_block`, MW-10.2-T09, MW-11.4-04): the question
 * is posted in the WorkItem's Conversation, then `work.block` is recorded with the handler's
 * checkpoint and one blocker citing that Message. The Coordinator's `work.unblock` resolution is kept
 * per WorkItem for the start that follows it (`slot.unblockedWith`), until a new ownership begins.
 * @module
 */
import { create } from "@bufbuild/protobuf";
import type { Agent } from "./agent.js";
import { lastSequence } from "./commands.js";
import { GetWorkItemRequestSchema } from "./gen/missionweave/v1/authority_service_pb.js";
import type { SignedEnvelope } from "./gen/missionweave/v1/common_pb.js";
import { MessageContentSchema, MessagePostSchema } from "./gen/missionweave/v1/conversation_pb.js";
import type { Event } from "./gen/missionweave/v1/event_pb.js";
import { BlockerSchema, WorkBlockSchema } from "./gen/missionweave/v1/work_pb.js";
import type { Blocked, Slot } from "./slot.js";

/** The latest unblock of a WorkItem: its resolution and the sequence of its event. */
export interface Unblock {
  /** `work.unblock`'s resolution. */
  readonly resolution: string;
  /** The sequence of the `work.unblocked` event. */
  readonly sequence: bigint;
}

const keyOf = (groupId: string, workItemId: string): string => `${groupId}\u0000${workItemId}`;

/** What a Worker runtime knows of its WorkItems' Conversations and unblocks, and how it records a block. */
export class Blocks {
  private readonly conversations = new Map<string, string>();
  private readonly resolutions = new Map<string, Unblock>();

  constructor(private readonly agent: Agent) {}

  /** Learns from an event of a served Group: a WorkItem's Conversation, an unblock, a new ownership. */
  observe(groupId: string, event: Event): void {
    const payload = event.payload;
    if (payload.case === "workAuthorized") this.conversations.set(keyOf(groupId, payload.value.workItemId), payload.value.conversationId);
    else if (payload.case === "workUnblocked") {
      this.resolutions.set(keyOf(groupId, payload.value.workItemId), { resolution: payload.value.resolution, sequence: event.sequence });
    } else if (payload.case === "workOfferAccepted" && payload.value.ownership !== undefined) {
      this.resolutions.delete(keyOf(groupId, payload.value.ownership.workItemId)); // a new ownership starts afresh
    }
  }

  /** The latest unblock of the WorkItem under its current ownership, if any. */
  unblocked(groupId: string, workItemId: string): Unblock | undefined {
    return this.resolutions.get(keyOf(groupId, workItemId));
  }

  /** Posts the question, then blocks citing it; the sequence of the `work.blocked` event. */
  async block(slot: Slot, result: Blocked): Promise<bigint> {
    const key = keyOf(slot.groupId, slot.workItemId);
    const post = create(MessagePostSchema, {
      conversationId: await this.conversationOf(slot.groupId, slot.workItemId),
      content: create(MessageContentSchema, { text: result.question }),
      topic: "blocker",
    });
    const posted = await this.agent.execute(slot.groupId, { case: "messagePost", value: post });
    const messageId =
      this.events(posted.events).flatMap((e) => (e.payload.case === "messagePosted" ? [e.payload.value.messageId] : []))[0] ?? "";
    const blocker = create(BlockerSchema, {
      blockerId: `blk-${slot.leaseId}`,
      kind: result.kind,
      description: result.question.slice(0, 4096),
      requiredResolution: result.requiredResolution,
      messageId,
    });
    const body = create(WorkBlockSchema, {
      workItemId: slot.workItemId,
      leaseId: slot.leaseId,
      ownershipEpoch: slot.ownershipEpoch,
      checkpoint: result.checkpoint,
      blockers: [blocker],
    });
    this.resolutions.delete(key); // the answer to this block is the next unblock's
    const done = await this.agent.execute(slot.groupId, { case: "workBlock", value: body });
    return lastSequence(this.events(done.events));
  }

  /** The WorkItem's Conversation: from its authorization, or (not replayed: a restarted runtime) the WorkItem itself. */
  private async conversationOf(groupId: string, workItemId: string): Promise<string> {
    const key = keyOf(groupId, workItemId);
    let conversationId = this.conversations.get(key);
    if (conversationId === undefined) {
      const read = await this.agent.mesh.authority.getWorkItem(create(GetWorkItemRequestSchema, { groupId, workItemId }), { timeoutMs: 10_000 });
      conversationId = read.workItem?.conversationId ?? "";
      this.conversations.set(key, conversationId);
    }
    return conversationId;
  }

  private events(events: readonly SignedEnvelope[]): Event[] {
    return events.map((e) => this.agent.verifier().event(e));
  }
}
