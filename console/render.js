// render.js: how the console draws sessions.
//
// Everything here builds nodes with createElement and text nodes, never innerHTML, so no
// text from the log is ever parsed as HTML.

import { Sections } from './sections.js';

/**
 * Makes an element. `attrs` are set as attributes (`class` and booleans handled), children
 * are nodes or strings (appended as text, never parsed).
 */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (name === 'class') node.className = value;
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children) if (child != null && child !== false) node.append(child);
  return node;
}

const clockFormat = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
const dateFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });
const numberFormat = new Intl.NumberFormat('en-US');

/** An RFC 3339 time in a local format (as it came if it does not parse). */
function formatIso(format, iso) {
  const time = Date.parse(iso);
  return Number.isNaN(time) ? String(iso ?? '') : format.format(time);
}

/** The text of content blocks; a block that is not text shows as its type in brackets. */
export function blocksText(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((block) => (typeof block?.text === 'string' ? block.text : `[${block?.type ?? 'block'}]`))
    .join('');
}

function pretty(value) {
  if (value === undefined) return '';
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

/** Appends text to an element, growing its last text node rather than adding nodes. */
function appendText(node, text) {
  const last = node.lastChild;
  if (last && last.nodeType === Node.TEXT_NODE) last.appendData(text);
  else node.append(text);
}

const STOP_LABELS = {
  end_turn: 'Turn ended', requires_action: 'Waiting for action', cancelled: 'Cancelled', cancel: 'Cancelled',
  max_tokens: 'Stopped: output token limit', max_turn_requests: 'Stopped: too many model requests',
  max_turns: 'Stopped: too many model requests',
  refusal: 'The model refused', error: 'Stopped by an error',
};

/** `tokens: 1,234 in · 56 out`, then any other counts the usage has. */
function usageText({ input_tokens: input = 0, output_tokens: output = 0, ...others }) {
  const parts = [`${numberFormat.format(input)} in`, `${numberFormat.format(output)} out`];
  for (const [name, value] of Object.entries(others)) {
    if (typeof value === 'number') parts.push(`${numberFormat.format(value)} ${name.replaceAll('_', ' ')}`);
  }
  return `tokens: ${parts.join(' · ')}`;
}

/** A row of the session list. */
export function sessionRow(item) {
  return h('li', {
    class: 'session-row', 'data-session-id': item.id, 'data-status': item.status,
    'data-created-at': item.created_at, 'data-updated-at': item.updated_at,
  },
  h('a', { href: `#/sessions/${encodeURIComponent(item.id)}` },
    h('span', { class: item.title ? 'title' : 'title untitled' }, item.title || item.id),
    h('span', { class: 'status' }, item.status),
    h('span', { class: 'meta' },
      `${item.agent} · ${item.created_by} · updated ${formatIso(dateFormat, item.updated_at)}`)));
}

// A turn goes on in a new part (a section of its own, put aside like a turn) after this
// many items, so that one turn of thousands of calls is not all in the page.
const PART_ITEMS = 50;
/** `3.2 s`, `2 min 5 s`: how long a turn took. */
function duration(ms) {
  if (!(ms >= 0)) return '';
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
  return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
}

/**
 * Draws one session from its events, taken one at a time: the readable conversation, a
 * section per turn under a header (its number, start, model, how long it took), and the
 * raw events table. Live following and replay both go through `apply`, so they look the
 * same; replaying to an earlier point is `reset` and applying again.
 */
export class SessionRenderer {
  /** Draws into `conversation`, and the raw events into `table` (a RawTable). */
  constructor({ conversation, table }) {
    Object.assign(this, { conversation, table });
    this.sections = new Sections(conversation);
    this.drawnItems = 0; // items drawn since the page opened (what a slice of drawing counts)
    this.reset();
  }

  /** Forgets every event drawn (the type filter and its options stay). */
  reset() {
    this.lastSeq = 0;
    this.lastId = null;
    this.title = null;
    this.ended = false; // the log ended (`terminated`): nothing more will come
    this.archived = false; // it takes no more input
    this.running = false; // a turn runs, or waits for an action (what Interrupt acts on)
    this.estimated = new Set(); // turn ids with a request whose usage turnlog estimated
    this.tools = new Map(); // a tool call's event id, and its tool_call_id → its .tool box
    this.texts = new Map(); // message_id → its .msg.agent while deltas grow it
    this.thoughts = new Map(); // message_id → its details.thinking while deltas grow it
    this.queued = new Map(); // user.message event id → its element, until a turn takes it
    this.interrupted = new Set(); // turn ids a user.interrupt cancelled
    this.resumed = new Set(); // turn ids just resumed, whose cut request's end is no failure
    this.turns = 0;
    this.turn = null; // the current turn: {id, head, started, parts}
    this.partItems = 0; // the items drawn in the current section
    this.batch = new Set(); // the calls drawn since the last item that was not a call
    this.sections.reset();
    this.section = this.sections.open('preamble');
    this.table.reset();
  }

  /** Before a conversation drawn out of sight shows: only its last section stays in the page. */
  showFromTheEnd() { this.sections.asideAllButLast(); }

  /** Draws an event; returns false (drawing nothing) if it was drawn already. */
  apply(event) {
    // Exactly once: the log numbers events 1, 2, 3, ... without gaps, so an event not past
    // the last one drawn (resent after a reconnect) is already on the page.
    if (!(event.sequence_number > this.lastSeq)) return false;
    this.lastSeq = event.sequence_number;
    this.lastId = event.id;
    this.table.add(event);
    try {
      this.draw(event);
    } catch (error) {
      // An event of a shape this page does not expect is shown as it is, and the page goes on.
      console.error(`event ${event.id} (${event.type}) could not be drawn:`, error);
      this.add(h('pre', { class: 'raw' }, pretty(event)));
    }
    return true;
  }

  // ---- The conversation ----

  /** Draws an item after the others, in a new part of the turn if this one is full. */
  add(node) {
    if (this.turn && this.partItems >= PART_ITEMS) this.openPart();
    this.partItems += 1;
    this.counted();
    if (!node.matches('.tool')) this.batch.clear();
    this.section.append(node);
    return node;
  }

  /** The current turn goes on in a section of its own. */
  openPart() {
    this.turn.parts += 1;
    this.section = this.sections.open('turn-part', { 'data-turn-id': this.turn.id, 'data-turn-n': this.turns, 'data-part': this.turn.parts });
    this.partItems = 0;
  }

  /** One more item drawn. */
  counted() {
    this.drawnItems += 1;
    this.sections.weigh(1);
  }

  /** A turn starts: a section of its own, under a header. */
  startTurn(e) {
    this.turns += 1;
    const head = h('div', { class: 'turn-head' },
      h('span', { class: 'turn-n' }, `Turn ${this.turns}`),
      h('time', { datetime: e.created_at, title: e.created_at }, formatIso(clockFormat, e.created_at)),
      h('span', { class: 'turn-model' }),
      h('span', { class: 'turn-took' }));
    this.section = this.sections.open('turn', { 'data-turn-id': e.turn_id, 'data-turn-n': this.turns });
    this.section.append(head);
    this.partItems = 0;
    this.batch.clear();
    this.turn = { id: e.turn_id, head, started: Date.parse(e.created_at), parts: 1 };
  }

  /** What the turn's header says once known: its model, and how long it took. */
  headTurn(e, { model, ended } = {}) {
    if (!this.turn || e.turn_id !== this.turn.id) return;
    if (model) this.turn.head.querySelector('.turn-model').textContent = model;
    if (ended) this.turn.head.querySelector('.turn-took').textContent = duration(Date.parse(e.created_at) - this.turn.started);
  }

  note(kind, text) { return this.add(h('div', { class: `note ${kind}` }, text)); }

  draw(e) {
    switch (e.type) {
      case 'session.created': return this.created(e);
      case 'session.updated': return this.updated(e);
      case 'session.archived':
        this.archived = true;
        return this.note('archived', 'Session archived');
      case 'session.deleted': return this.note('deleted', 'Session deleted');
      case 'turn.input': return this.taken(e.event_ids ?? []);
      case 'user.message': return this.userMessage(e);
      case 'user.interrupt':
        if (e.turn_id) this.interrupted.add(e.turn_id);
        return this.note('interrupt', 'Interrupted by the user');
      case 'user.define_outcome': return this.note('outcome', `Outcome: ${pretty(e.outcome)}`);
      case 'user.tool_confirmation': return this.decision(e);
      case 'user.custom_tool_result': return this.toolResult(e, e.custom_tool_use_id);
      case 'agent.thinking.delta': return this.thinking(e.message_id, e.delta, false);
      case 'agent.thinking': return this.thinking(e.message_id, e.thinking, true);
      case 'agent.message.delta': return this.agentText(e.message_id, e.delta, false);
      case 'agent.message': return this.agentText(e.message_id, blocksText(e.content), true);
      case 'agent.tool_use':
      case 'agent.custom_tool_use': return this.toolCall(e);
      case 'agent.tool_result': return this.toolResult(e, e.tool_use_id);
      case 'agent.mcp_tools': return this.mcpTools(e.servers ?? []);
      case 'session.status_idle': return this.turnEnd(e);
      case 'session.error': return this.error(e);
      case 'turn.resumed': return this.resume(e);
      case 'history.compacted': return this.compacted(e);
      case 'user.compact': return this.note('compact', 'Compaction asked for: the conversation so far is summarised');
      case 'turn.branched': return this.note('branched', `This turn goes on from an earlier turn (${e.from}): the turns after it are set aside`);
      case 'span.outcome_evaluation_start': return undefined;
      case 'span.outcome_evaluation_end': return this.evaluated(e);
      case 'span.model_request_end':
        if (e.usage_estimated) this.estimated.add(e.turn_id);
        // A request the user's interrupt cut short ends as an error too, but it did not
        // fail; nor did one its stopped process cut short (the resume said so).
        if (e.is_error && this.resumed.delete(e.turn_id)) return undefined;
        if (e.is_error && !this.interrupted.has(e.turn_id)) this.note('model-error', `The request to ${e.model} failed`);
        return undefined;
      case 'terminated':
        this.finishStreaming();
        this.ended = true;
        this.running = false;
        return this.note('terminated', `Session ended${e.reason ? `: ${e.reason}` : ''}`);
      case 'session.status_running':
        this.running = true;
        // Running again after a resume: a later failed request is a failure again.
        this.resumed.delete(e.turn_id);
        return undefined;
      case 'turn.started': return this.startTurn(e);
      case 'span.model_request_start': return this.headTurn(e, { model: e.model });
      default:
        return this.add(h('pre', { class: 'raw' }, pretty(e)));
    }
  }

  created(e) {
    this.title = e.title ?? null;
    let text = `Session created by ${e.created_by ?? 'someone'} with agent ${e.agent?.name ?? '?'}`;
    if (e.tools?.length) text += ` · client tools: ${e.tools.map((tool) => tool.name).join(', ')}`;
    if (e.mode) text += ` · mode ${e.mode}`;
    if (e.model) text += ` · model ${e.model}`;
    if (e.title) text += ` · “${e.title}”`;
    const note = this.note('created', text);
    const fork = e.forked_from;
    if (fork?.session_id) {
      // A fork: where it came from, a link to its source at the point it continues.
      note.append(h('div', { class: 'fork' }, 'Forked from ',
        h('a', { href: `#/sessions/${encodeURIComponent(fork.session_id)}`, title: fork.session_id }, fork.session_id),
        ` at event #${fork.sequence_number} (`, h('code', { title: `hash ${fork.hash}` }, fork.event_id), ')'));
    }
    if (e.replay_of?.session_id) note.append(h('div', { class: 'fork' }, `A replay of ${e.replay_of.session_id}`));
  }

  updated(e) {
    const changes = [];
    if (e.title != null) {
      this.title = e.title;
      changes.push(`title “${e.title}”`);
    }
    if (e.agent) changes.push(`agent ${e.agent.name}`);
    if (e.tools) changes.push(`client tools: ${e.tools.map((tool) => tool.name).join(', ') || 'none'}`);
    if (e.metadata) changes.push(`metadata ${JSON.stringify(e.metadata)}`);
    if (e.mode) changes.push(`mode ${e.mode} from the next turn`);
    if (e.model) changes.push(`model ${e.model} from the next turn`);
    this.note('updated', `Session updated${changes.length ? `: ${changes.join(' · ')}` : ''}`);
  }

  /** The conversation so far summarised (asked for, or to fit the model's window). */
  compacted(e) {
    const what = e.strategy === 'tool_outputs' ? 'old tool outputs cut short' : `${e.messages} messages summarised`;
    const tokens = `${numberFormat.format(e.tokens_before)} → ${numberFormat.format(e.tokens_after)} tokens`;
    const box = this.add(h('details', { class: 'compaction', 'data-event-id': e.id },
      h('summary', {}, `Conversation compacted: ${what} (${tokens})`)));
    if (e.summary) box.append(h('div', { class: 'compaction-summary' }, e.summary));
  }

  /** An outcome's evaluation: its verdict, and why. */
  evaluated(e) {
    const verdict = e.result?.replaceAll('_', ' ') ?? '?';
    this.add(h('div', { class: 'evaluation', 'data-result': e.result, 'data-event-id': e.id },
      h('div', { class: 'evaluation-head' }, h('span', { class: 'verdict' }, verdict), ` · outcome “${e.description ?? ''}” · evaluation ${e.iteration}`),
      e.explanation ? h('div', { class: 'evaluation-why' }, e.explanation) : null));
  }

  /** The model's plan (the built-in `update_plan`'s input), as a list of steps. */
  plan(e) {
    const steps = (Array.isArray(e.input?.entries) ? e.input.entries : []).filter((step) => step && typeof step === 'object');
    const marks = { pending: '○', in_progress: '◐', completed: '●' };
    const marked = (step) => step.priority && step.priority !== 'medium';
    return h('ol', { class: 'plan-steps' }, ...steps.map((step) => h('li', { 'data-status': step.status, 'data-priority': step.priority },
      h('span', { class: 'mark', title: step.status }, marks[step.status] ?? '○'), ' ', String(step.content ?? ''),
      marked(step) ? ' ' : null, marked(step) ? h('span', { class: 'tag' }, `${step.priority} priority`) : null)));
  }

  userMessage(e) {
    const node = this.add(h('div', { class: 'msg user', 'data-event-id': e.id }, blocksText(e.content)));
    // Sent while a turn ran: it waits (processed_at null) until a later turn.input takes it.
    node.classList.toggle('queued', e.processed_at == null);
    if (e.processed_at == null) this.queued.set(e.id, node);
  }

  taken(eventIds) {
    for (const id of eventIds) {
      this.queued.get(id)?.classList.remove('queued');
      this.queued.delete(id);
    }
  }

  // Deltas grow the text as they come; the final event with the same message_id replaces it.
  agentText(messageId, text, final) {
    let node = this.texts.get(messageId);
    if (!node) {
      // Nothing drawn for a message until it has text: one with none (only tool calls, or
      // an empty delta) would end the batch of calls drawn just before it.
      if (!text) return;
      const before = new Set(this.batch);
      node = this.add(h('div', { class: 'msg agent streaming', 'data-message-id': messageId }));
      node.batchBefore = before; // the run of calls it ended, should it come to nothing
      this.texts.set(messageId, node);
    }
    if (!final) {
      appendText(node, text ?? '');
      return;
    }
    this.texts.delete(messageId);
    node.classList.remove('streaming');
    if (text) {
      node.textContent = text;
      return;
    }
    // Its text came to nothing: gone from the page, the calls drawn just before it are
    // the run of calls again (across parts too), so that their results still go under them.
    const last = node === this.section.lastElementChild;
    node.remove();
    if (last) this.batch = node.batchBefore;
  }

  thinking(messageId, text, final) {
    let box = this.thoughts.get(messageId);
    if (!box) {
      if (!text) return; // as for a message: nothing drawn until there is text
      box = this.add(h('details', { class: 'thinking streaming', 'data-message-id': messageId },
        h('summary', {}, 'Thinking'), h('div', { class: 'thinking-text' })));
      this.thoughts.set(messageId, box);
    }
    const body = box.lastChild;
    if (!final) {
      appendText(body, text ?? '');
      return;
    }
    this.thoughts.delete(messageId);
    box.classList.remove('streaming');
    body.textContent = text ?? '';
  }

  /**
   * The turn's process stopped and the turn goes on from its log: what it had streamed of
   * unfinished messages is struck out (their final events never come), and a note says
   * what became of the calls that were running.
   */
  resume(e) {
    this.resumed.add(e.turn_id);
    for (const id of e.discarded ?? []) {
      for (const growing of [this.texts, this.thoughts]) {
        const node = growing.get(id);
        if (!node) continue;
        growing.delete(id);
        node.classList.remove('streaming');
        node.classList.add('retracted');
        node.title = 'Discarded: the server stopped before this was finished; the turn went on';
      }
    }
    const parts = [`The server stopped during this turn; it goes on (resume ${e.attempt})`];
    if (e.discarded?.length) parts.push('the unfinished reply is struck out');
    if (e.rerun?.length) parts.push(`${e.rerun.length} tool call(s) run again`);
    if (e.interrupted?.length) parts.push(`${e.interrupted.length} tool call(s) answered as interrupted`);
    this.note('resumed', parts.join(' · '));
  }

  /** Ends the growing texts of a turn that stopped before their final events. */
  finishStreaming() {
    for (const node of [...this.texts.values(), ...this.thoughts.values()]) node.classList.remove('streaming');
    this.texts.clear();
    this.thoughts.clear();
  }

  toolCall(e) {
    const custom = e.type === 'agent.custom_tool_use';
    if (this.repeatOf(e)) return undefined;
    const head = h('div', { class: 'tool-head' }, h('span', { class: 'tool-name' }, e.name));
    if (custom) head.append(h('span', { class: 'tag' }, 'client tool'));
    if (e.evaluated_permission && e.evaluated_permission !== 'allow') {
      head.append(h('span', { class: 'tag permission', 'data-permission': e.evaluated_permission },
        e.evaluated_permission === 'ask' ? 'needs approval' : 'denied by policy'));
    }
    const isPlan = !custom && e.name === 'update_plan' && !e.mcp;
    if (isPlan) head.append(h('span', { class: 'tag' }, 'plan'));
    const body = isPlan ? this.plan(e) : h('pre', { class: 'tool-input' }, pretty(e.input));
    const call = h('div', { class: custom ? 'tool-call custom' : 'tool-call', 'data-event-id': e.id, 'data-tool-call-id': e.tool_call_id },
      head, body);
    const box = this.add(h('div', { class: isPlan ? 'tool plan' : 'tool' }, call));
    box.dataset.call = JSON.stringify([e.type, e.name, e.input, e.evaluated_permission]);
    this.batch.add(box);
    this.tools.set(e.id, box);
    if (e.tool_call_id) this.tools.set(e.tool_call_id, box);
  }

  /**
   * A call the same as the one just before it (its tool, its input, its permission), that
   * one answered and asking nothing: drawn as one more of that call (`×N`), its result kept
   * under it, folded.
   */
  repeatOf(e) {
    const last = this.section.lastElementChild;
    if (!last?.matches('.tool:not(.continued)') || last.dataset.call !== JSON.stringify([e.type, e.name, e.input, e.evaluated_permission])) return false;
    if (!last.querySelector(':scope > .tool-result, :scope > .repeats') || e.evaluated_permission === 'ask') return false;
    // Each repeat counts as an item of the part: thousands of the same call go on in the
    // turn's next parts (a box of their own, folding the next ones), not in one huge box.
    if (this.partItems >= PART_ITEMS) return false;
    this.partItems += 1;
    let repeats = last.querySelector(':scope > .repeats');
    if (!repeats) {
      repeats = h('details', { class: 'repeats' }, h('summary', {}));
      last.append(repeats);
    }
    const n = repeats.childElementCount; // the summary, then one per repeat: n - 1 so far
    repeats.append(h('div', { class: 'repeat', 'data-event-id': e.id, 'data-tool-call-id': e.tool_call_id }));
    repeats.firstChild.textContent = `${n} more call${n === 1 ? '' : 's'} with the same input`;
    let count = last.querySelector('.tool-head .count');
    if (!count) {
      count = h('span', { class: 'tag count' });
      last.querySelector('.tool-head').append(count);
    }
    count.textContent = `×${n + 1}`;
    this.counted();
    this.tools.set(e.id, repeats.lastChild);
    if (e.tool_call_id) this.tools.set(e.tool_call_id, repeats.lastChild);
    return true;
  }

  /**
   * Puts a result or decision under its tool call, or at the end if the call is unknown.
   * The page reads top to bottom in the log's order: if anything was drawn after the
   * call's box (its turn ended waiting for a decision, say), what comes for the call now
   * goes in a box of its own at the end, naming the call it continues. Calls made
   * together stand one after another, across parts of a turn too: a result goes under
   * its own while nothing but calls was drawn after it.
   */
  underCall(node, callEventId, toolCallId) {
    let box = this.tools.get(callEventId) ?? this.tools.get(toolCallId);
    if (!box) return void this.add(node);
    this.counted();
    if (box.matches('.repeat')) return void box.append(node); // one more of a call drawn once
    if (!this.batch.has(box)) {
      const call = box.querySelector('.tool-call') ?? box.querySelector('.tool-ref');
      const name = call?.querySelector('.tool-name')?.textContent ?? call?.dataset.toolName ?? '';
      const ref = h('div', { class: 'tool-ref', 'data-call-event-id': call?.dataset.eventId ?? callEventId, 'data-tool-name': name },
        h('span', { class: 'tool-name' }, name), h('span', { class: 'tag' }, 'continued'));
      const next = this.add(h('div', { class: 'tool continued' }, ref));
      for (const [key, value] of this.tools) if (value === box) this.tools.set(key, next);
      this.batch.add(next);
      box = next;
    }
    box.append(node);
  }

  toolResult(e, callEventId) {
    const node = h('div', { class: e.is_error ? 'tool-result is-error' : 'tool-result', 'data-event-id': e.id },
      h('pre', {}, blocksText(e.content)));
    this.underCall(node, callEventId, e.tool_call_id);
  }

  decision(e) {
    let text = e.result === 'allow' ? 'Allowed' : 'Denied';
    if (e.deny_message) text += `: ${e.deny_message}`;
    if (e.remember) text += ' (remembered for this tool)';
    this.underCall(h('div', { class: 'decision', 'data-result': e.result, 'data-event-id': e.id }, text),
      e.tool_use_id, e.tool_call_id);
  }

  mcpTools(servers) {
    const list = servers.map((server) => `${server.server}: ${(server.tools ?? []).join(', ') || 'no tools'}`);
    this.note('mcp', `MCP tools — ${list.join('; ') || 'none'}`);
  }

  turnEnd(e) {
    this.finishStreaming();
    // The native stream names the seed's reason in `type`, and turnlog's own in `detail`
    // where the two differ (a cut-short reply is the seed's `end_turn`).
    const stop = e.stop_reason?.detail ?? e.stop_reason?.type ?? 'unknown';
    this.running = stop === 'requires_action';
    this.headTurn(e, { ended: true });
    const end = h('div', { class: 'turn-end' },
      h('span', { class: 'stop', 'data-stop': stop, title: stop }, STOP_LABELS[stop] ?? stop));
    if (e.usage) {
      // A request cut short before its provider said what it used is counted by turnlog's
      // estimate (the log marks it): the usage says so.
      const estimated = this.estimated.has(e.turn_id);
      const title = estimated ? 'estimated: a request of this turn was cut short before its provider reported its usage' : null;
      end.append(h('span', { class: estimated ? 'usage estimated' : 'usage', title }, `${estimated ? '≈ ' : ''}${usageText(e.usage)}`));
    }
    this.add(end);
  }

  error(e) {
    let text = e.code ? `${e.code}: ${e.error ?? ''}` : String(e.error ?? 'error');
    if (e.mcp_server) text += ` (MCP server ${e.mcp_server})`;
    this.add(h('div', { class: 'error', 'data-event-id': e.id }, text));
  }
}
