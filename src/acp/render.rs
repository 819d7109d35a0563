//! Log events as ACP `session/update`s: live, as a prompt's events arrive ([`Live`]), and
//! as a whole conversation for `session/load` ([`replay`]). Pure: no IO, no rules.

use std::collections::HashMap;

use agent_client_protocol::v1::schema::{
    Content, ContentBlock, ContentChunk, CurrentModeUpdate, ImageContent, MessageId, Plan, PlanEntry,
    PlanEntryPriority, PlanEntryStatus, SessionInfoUpdate, SessionUpdate, TextContent, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, UsageUpdate,
};
use serde_json::Value;

use crate::domain::event::{ClientRun, Permission};
use crate::domain::{Block, Event, EventBody, EventId, Message, Part};

/// A tool call as a prompt knows it: what to ask the client about, and who runs it.
#[derive(Debug, Clone)]
pub struct Call {
    pub name: String,
    pub input: Value,
    /// Run by the client: one of the editor's tools, or another client tool (of the
    /// agent's config), which ACP has no way to run.
    pub client: bool,
    /// The client asks the user before it runs the call (the session's mode says to).
    pub ask: bool,
    /// One of the editor's tools: run here, on the editor's files and terminals.
    pub editor: bool,
}

impl Call {
    /// The call as the client's permission dialog shows it.
    pub fn update(&self, id: EventId) -> ToolCallUpdate {
        let fields = ToolCallUpdateFields::new()
            .title(title(&self.name, &self.input))
            .kind(kind(&self.name))
            .status(ToolCallStatus::Pending)
            .raw_input(self.input.clone());
        ToolCallUpdate::new(id.to_string(), fields)
    }
}

/// The updates of one prompt, event by event. Text and thinking go out as their deltas
/// come; a final message adds only what its deltas did not say (all of it when the
/// follower joined after them).
#[derive(Debug, Default)]
pub struct Live {
    said: HashMap<String, usize>,
    pub calls: HashMap<EventId, Call>,
}

impl Live {
    pub fn update(&mut self, event: &Event) -> Vec<SessionUpdate> {
        match &event.body {
            EventBody::AgentThinkingDelta { message_id, delta } => self.say(message_id, delta, Chunk::Thought),
            EventBody::AgentMessageDelta { message_id, delta } => self.say(message_id, delta, Chunk::Message),
            EventBody::AgentThinking { message_id, thinking } => self.rest(message_id, thinking, Chunk::Thought),
            EventBody::AgentMessage { message_id, content } => {
                self.rest(message_id, &Block::join_text(content), Chunk::Message)
            }
            EventBody::AgentToolUse { name, input, evaluated_permission, .. } => {
                let call = Call { name: name.clone(), input: input.clone(), client: false, ask: false, editor: false };
                self.calls.insert(event.id, call);
                let call = SessionUpdate::ToolCall(tool_call(event.id, name, input, ToolCallStatus::Pending));
                match evaluated_permission {
                    // It runs at once.
                    Permission::Allow => vec![call, status(event.id, ToolCallStatus::InProgress)],
                    _ => vec![call],
                }
            }
            EventBody::AgentCustomToolUse { name, input, ask, editor, .. } => {
                let call = Call { name: name.clone(), input: input.clone(), client: true, ask: *ask, editor: *editor };
                self.calls.insert(event.id, call);
                vec![SessionUpdate::ToolCall(tool_call(event.id, name, input, ToolCallStatus::Pending))]
            }
            EventBody::UserToolConfirmation {
                tool_use_id, result: crate::domain::event::Confirmation::Allow, ..
            } => tool_use_id.parse().map(|id| vec![status(id, ToolCallStatus::InProgress)]).unwrap_or_default(),
            EventBody::AgentToolResult { tool_use_id, content, is_error, .. } => {
                let planned = self.calls.get(tool_use_id).and_then(|call| planned(&call.name, &call.input, *is_error));
                std::iter::once(finished(*tool_use_id, content, *is_error)).chain(planned).collect()
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, ran, .. } => custom_tool_use_id
                .parse()
                .map(|id| vec![ran_by_client(finished(id, content, *is_error), ran.as_ref())])
                .unwrap_or_default(),
            EventBody::ModelRequestEnd { .. } => usage(event).into_iter().collect(),
            EventBody::HistoryCompacted { .. } => compacted(event).into_iter().collect(),
            // Retitled (through another view: ACP has no way to): the editor's list shows it.
            // A mode changed (by this client or another): the editor's picker shows it.
            EventBody::SessionUpdated { title, mode, .. } => {
                let retitled = title.as_ref().map(|title| {
                    let info = SessionInfoUpdate::new().title(title.clone()).updated_at(event.created_at.clone());
                    SessionUpdate::SessionInfoUpdate(info)
                });
                let moded =
                    mode.as_ref().map(|mode| SessionUpdate::CurrentModeUpdate(CurrentModeUpdate::new(mode.clone())));
                retitled.into_iter().chain(moded).collect()
            }
            _ => Vec::new(),
        }
    }

    fn say(&mut self, message_id: &str, text: &str, chunk: Chunk) -> Vec<SessionUpdate> {
        *self.said.entry(message_id.to_string()).or_default() += text.len();
        chunk.of(message_id, text).into_iter().collect()
    }

    fn rest(&mut self, message_id: &str, whole: &str, chunk: Chunk) -> Vec<SessionUpdate> {
        let said = self.said.insert(message_id.to_string(), whole.len()).unwrap_or(0);
        chunk.of(message_id, whole.get(said..).unwrap_or_default()).into_iter().collect()
    }
}

#[derive(Debug, Clone, Copy)]
enum Chunk {
    Message,
    Thought,
}

impl Chunk {
    fn of(self, message_id: &str, text: &str) -> Option<SessionUpdate> {
        if text.is_empty() {
            return None;
        }
        let chunk =
            ContentChunk::new(ContentBlock::Text(TextContent::new(text))).message_id(MessageId::new(message_id));
        Some(match self {
            Chunk::Message => SessionUpdate::AgentMessageChunk(chunk),
            Chunk::Thought => SessionUpdate::AgentThoughtChunk(chunk),
        })
    }
}

/// A whole conversation, in log order: user messages block by block, each agent message
/// and thought whole, each tool call once, with its final status and content.
pub fn replay(events: &[Event]) -> Vec<SessionUpdate> {
    let mut results: HashMap<EventId, (&[Block], bool, Option<&ClientRun>)> = HashMap::new();
    for event in events {
        match &event.body {
            EventBody::AgentToolResult { tool_use_id, content, is_error, .. } => {
                results.insert(*tool_use_id, (content, *is_error, None));
            }
            EventBody::UserCustomToolResult { custom_tool_use_id, content, is_error, ran, .. } => {
                if let Ok(id) = custom_tool_use_id.parse() {
                    results.insert(id, (content, *is_error, ran.as_ref()));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for event in events {
        match &event.body {
            // A session that starts from a conversation (a fork, a seeded session): it first.
            EventBody::SessionCreated { spec, .. } => out.extend(seeded(event.id, &spec.messages)),
            EventBody::UserMessage { content } => out.extend(content.iter().map(|block| {
                SessionUpdate::UserMessageChunk(
                    ContentChunk::new(content_block(block)).message_id(MessageId::new(event.id.to_string())),
                )
            })),
            EventBody::AgentThinking { message_id, thinking } => out.extend(Chunk::Thought.of(message_id, thinking)),
            EventBody::HistoryCompacted { .. } => out.extend(compacted(event)),
            EventBody::AgentMessage { message_id, content } => {
                out.extend(Chunk::Message.of(message_id, &Block::join_text(content)))
            }
            EventBody::AgentToolUse { name, input, .. } | EventBody::AgentCustomToolUse { name, input, .. } => {
                let call = match results.get(&event.id) {
                    Some((content, is_error, ran)) => {
                        let mut call = tool_call(event.id, name, input, done(*is_error)).content(tool_content(content));
                        if let Some(ran) = ran {
                            let (shown, locations) = super::editor::shown(ran);
                            call.content.splice(0..0, shown);
                            // (As live: the call's own locations unless the run says.)
                            if !locations.is_empty() {
                                call.locations = locations;
                            }
                        }
                        out.push(SessionUpdate::ToolCall(call));
                        out.extend(planned(name, input, *is_error));
                        continue;
                    }
                    // Left waiting (by a turn that was stopped before it was answered).
                    None => tool_call(event.id, name, input, ToolCallStatus::Pending),
                };
                out.push(SessionUpdate::ToolCall(call));
            }
            _ => {}
        }
    }
    out
}

/// The conversation a session was made with, as a replay shows its own: the messages of
/// the `session.created` event `created`, numbered after it (`evt_…-0`, `evt_…-1`, ...),
/// each tool call once with its result. A call the seed leaves unanswered is not shown
/// here: the session records it as a call of its own, which the replay shows after.
fn seeded(created: EventId, messages: &[Message]) -> Vec<SessionUpdate> {
    let results: HashMap<&str, (&[Block], bool)> = messages
        .iter()
        .filter_map(|message| match message {
            Message::Tool { tool_call_id, content, is_error } => {
                Some((tool_call_id.as_str(), (&content[..], *is_error)))
            }
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let id = format!("{created}-{i}");
        match message {
            Message::User { content } => out.extend(content.iter().map(|block| {
                SessionUpdate::UserMessageChunk(
                    ContentChunk::new(content_block(block)).message_id(MessageId::new(&*id)),
                )
            })),
            Message::Assistant { content } => {
                for part in content {
                    match part {
                        Part::Text { text } => out.extend(Chunk::Message.of(&id, text)),
                        Part::Thinking { thinking } => out.extend(Chunk::Thought.of(&id, thinking)),
                        Part::ToolUse { tool_call_id, name, input } => {
                            let call = ToolCall::new(tool_call_id.clone(), title(name, input))
                                .kind(kind(name))
                                .raw_input(input.clone());
                            // Unanswered: recorded again as the session's own waiting call.
                            let Some((content, is_error)) = results.get(tool_call_id.as_str()) else { continue };
                            let call = call.status(done(*is_error)).content(tool_content(content));
                            out.push(SessionUpdate::ToolCall(call));
                        }
                    }
                }
            }
            Message::System { .. } | Message::Tool { .. } => {}
        }
    }
    out
}

/// The plan a call of the built-in `update_plan` wrote, once it ran: the editor's plan
/// panel shows it (the call itself shows as a tool call too, of kind `think`).
fn planned(name: &str, input: &Value, is_error: bool) -> Option<SessionUpdate> {
    use crate::domain::plan::{self, Priority, StepStatus};
    if name != plan::TOOL || is_error {
        return None;
    }
    let entries = plan::Plan::read(input)
        .ok()?
        .entries
        .into_iter()
        .map(|step| {
            let priority = match step.priority {
                Priority::High => PlanEntryPriority::High,
                Priority::Medium => PlanEntryPriority::Medium,
                Priority::Low => PlanEntryPriority::Low,
            };
            let status = match step.status {
                StepStatus::Pending => PlanEntryStatus::Pending,
                StepStatus::InProgress => PlanEntryStatus::InProgress,
                StepStatus::Completed => PlanEntryStatus::Completed,
            };
            PlanEntry::new(step.content, priority, status)
        })
        .collect();
    Some(SessionUpdate::Plan(Plan::new(entries)))
}

/// A compaction as the conversation shows it, a line of the agent's (the summary itself is
/// the model's, in the log, not shown).
fn compacted(event: &Event) -> Option<SessionUpdate> {
    use crate::domain::event::Compaction;
    let EventBody::HistoryCompacted { strategy, messages, tokens_before, tokens_after, .. } = &event.body else {
        return None;
    };
    let what = match strategy {
        Compaction::Summary => format!("{messages} earlier messages summarised"),
        Compaction::ToolOutputs => format!("the tool outputs of {messages} earlier messages cut"),
    };
    let text = format!("[Conversation compacted: {what}, about {tokens_before} → {tokens_after} tokens.]");
    Chunk::Message.of(&event.id.to_string(), &text)
}

/// How full the model's context is after a model request that ended well, where its
/// window is known: what it read and wrote, of its window.
fn usage(event: &Event) -> Option<SessionUpdate> {
    match &event.body {
        EventBody::ModelRequestEnd { usage, is_error: false, context_window: Some(window), .. } => {
            let used = usage.input_tokens + usage.output_tokens;
            Some(SessionUpdate::UsageUpdate(UsageUpdate::new(used, *window)))
        }
        _ => None,
    }
}

/// How full the model's context is now: [`usage`] of the session's last request that says.
pub fn context(events: &[Event]) -> Option<SessionUpdate> {
    events.iter().rev().find_map(usage)
}

/// What an editor's session list shows of the session, as the log says it now: its title
/// (the last one it was given, if any) and when it last changed (its last event).
pub fn info(events: &[Event]) -> Option<SessionUpdate> {
    let last = events.last()?;
    let title = events.iter().rev().find_map(|event| match &event.body {
        EventBody::SessionUpdated { title: Some(title), .. } => Some(title),
        EventBody::SessionCreated { spec, .. } => spec.title.as_ref(),
        _ => None,
    });
    let info = SessionInfoUpdate::new().title(title.cloned()).updated_at(last.created_at.clone());
    Some(SessionUpdate::SessionInfoUpdate(info))
}

fn tool_call(id: EventId, name: &str, input: &Value, status: ToolCallStatus) -> ToolCall {
    ToolCall::new(id.to_string(), title(name, input))
        .kind(kind(name))
        .status(status)
        .raw_input(input.clone())
        .locations(super::editor::locations(name, input))
}

/// A client's result as the editor shows it, with what the client recorded of the run:
/// the edit's diff before the result's text, and the files it touched.
fn ran_by_client(update: SessionUpdate, ran: Option<&ClientRun>) -> SessionUpdate {
    match (update, ran) {
        (SessionUpdate::ToolCallUpdate(mut update), Some(ran)) => {
            let (shown, locations) = super::editor::shown(ran);
            let content = update.fields.content.get_or_insert_with(Vec::new);
            content.splice(0..0, shown);
            if !locations.is_empty() {
                update.fields.locations = Some(locations);
            }
            SessionUpdate::ToolCallUpdate(update)
        }
        (update, _) => update,
    }
}

fn status(id: EventId, status: ToolCallStatus) -> SessionUpdate {
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), ToolCallUpdateFields::new().status(status)))
}

fn finished(id: EventId, content: &[Block], is_error: bool) -> SessionUpdate {
    let fields = ToolCallUpdateFields::new().status(done(is_error)).content(tool_content(content));
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
}

fn done(is_error: bool) -> ToolCallStatus {
    if is_error {
        ToolCallStatus::Failed
    } else {
        ToolCallStatus::Completed
    }
}

fn tool_content(content: &[Block]) -> Vec<ToolCallContent> {
    content.iter().map(|block| ToolCallContent::Content(Content::new(content_block(block)))).collect()
}

/// `calculator: 2*(3+4)` for a call with one string argument, else the name and the input
/// (the editor's tools say what they do: `Read /a/b.rs`).
fn title(name: &str, input: &Value) -> String {
    if let Some(title) = super::editor::title(name, input) {
        return title;
    }
    let mut strings = input.as_object().into_iter().flat_map(|o| o.values()).filter_map(Value::as_str);
    let title = match (input.as_object().map(|o| o.len()), strings.next()) {
        (Some(1), Some(only)) => format!("{name}: {only}"),
        (Some(0), _) | (None, _) => name.to_string(),
        _ => format!("{name} {input}"),
    };
    match title.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &title[..cut]),
        None => title,
    }
}

/// What an editor shows for a tool, guessed from its name.
fn kind(name: &str) -> ToolKind {
    if name == crate::domain::plan::TOOL {
        return ToolKind::Think;
    }
    let name = name.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| name.contains(w));
    if has(&["fetch", "http", "url"]) {
        ToolKind::Fetch
    } else if has(&["search", "grep", "find"]) {
        ToolKind::Search
    } else if has(&["read", "get_file", "cat"]) {
        ToolKind::Read
    } else if has(&["edit", "write", "patch"]) {
        ToolKind::Edit
    } else if has(&["delete", "remove"]) {
        ToolKind::Delete
    } else if has(&["exec", "shell", "run_", "command", "terminal"]) {
        ToolKind::Execute
    } else {
        ToolKind::Other
    }
}

/// A stored block as ACP content: blocks an ACP client sent are ACP's shape already;
/// other views' images become ACP images, and anything else a line of text saying what it is.
pub fn content_block(block: &Block) -> ContentBlock {
    let value = serde_json::to_value(block).unwrap_or(Value::Null);
    if let Ok(acp) = serde_json::from_value::<ContentBlock>(value) {
        return acp;
    }
    if let Some(file) = block.file().filter(|f| f.mime.starts_with("image/")) {
        return ContentBlock::Image(ImageContent::new(file.base64, file.mime));
    }
    let source = block.rest.get("source");
    if let (Some("base64"), Some(data), Some(mime)) = (
        source.and_then(|s| s["type"].as_str()),
        source.and_then(|s| s["data"].as_str()),
        source.and_then(|s| s["media_type"].as_str()),
    ) {
        return ContentBlock::Image(ImageContent::new(data, mime));
    }
    let name = block.file().map(|f| format!(" {} ({})", f.name, f.mime)).unwrap_or_default();
    ContentBlock::Text(TextContent::new(format!("[{}{name}]", block.kind)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::{SessionId, TurnId};

    fn event(body: EventBody) -> Event {
        Event {
            id: EventId(crate::domain::ids::IDS.next()),
            session_id: SessionId::generate(),
            turn_id: Some(TurnId::generate()),
            turn_sequence_number: Some(1),
            sequence_number: 1,
            created_at: "2026-11-23T00:00:00.000000Z".into(),
            processed_at: Some("2026-11-23T00:00:00.000000Z".into()),
            schema_version: 1,
            body,
        }
    }

    fn wire(updates: &[SessionUpdate]) -> Vec<Value> {
        updates.iter().map(|u| serde_json::to_value(u).unwrap()).collect()
    }

    fn texts(updates: &[SessionUpdate]) -> Vec<String> {
        wire(updates).iter().filter_map(|u| u["content"]["text"].as_str().map(String::from)).collect()
    }

    #[test]
    fn a_seeded_conversation_replays_first_and_each_call_once() {
        use crate::domain::event::SessionSpec;
        let call = |id: &str| Part::ToolUse { tool_call_id: id.into(), name: "get_weather".into(), input: json!({}) };
        let messages = vec![
            Message::User { content: vec![Block::text("weather?")] },
            Message::Assistant { content: vec![Part::Text { text: "looking".into() }, call("c1"), call("c2")] },
            Message::Tool { tool_call_id: "c1".into(), content: vec![Block::text("cold")], is_error: false },
        ];
        let spec = SessionSpec { messages, ..SessionSpec::default() };
        let created = event(EventBody::SessionCreated { spec, created_by: "local".into() });
        // The seed leaves c2 unanswered: the session records it as its own waiting call.
        let waiting = event(EventBody::AgentCustomToolUse {
            tool_call_id: "c2".into(),
            name: "get_weather".into(),
            input: json!({}),
            ask: false,
            editor: false,
        });
        let updates = wire(&replay(&[created.clone(), waiting.clone()]));
        let kinds: Vec<&str> = updates.iter().map(|u| u["sessionUpdate"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["user_message_chunk", "agent_message_chunk", "tool_call", "tool_call"]);
        assert_eq!(updates[0]["messageId"], format!("{}-0", created.id));
        assert_eq!((&updates[2]["toolCallId"], &updates[2]["status"]), (&json!("c1"), &json!("completed")));
        assert_eq!(updates[2]["content"][0]["content"]["text"], "cold");
        assert_eq!(updates[3]["toolCallId"], waiting.id.to_string(), "the waiting call once, as the session's own");
    }

    #[test]
    fn a_final_message_adds_only_what_its_deltas_did_not_say() {
        let mut live = Live::default();
        let delta = |text: &str| EventBody::AgentMessageDelta { message_id: "msg_1".into(), delta: text.into() };
        let mut out = Vec::new();
        for body in [delta("echo: "), delta("hel")] {
            out.extend(live.update(&event(body)));
        }
        out.extend(live.update(&event(EventBody::AgentMessage {
            message_id: "msg_1".into(),
            content: vec![Block::text("echo: hello")],
        })));
        assert_eq!(texts(&out), ["echo: ", "hel", "lo"]);
        // A follower that joined after the deltas gets the whole message.
        let whole = Live::default()
            .update(&event(EventBody::AgentThinking { message_id: "msg_2".into(), thinking: "hmm".into() }));
        assert_eq!(wire(&whole)[0]["sessionUpdate"], "agent_thought_chunk");
        assert_eq!(texts(&whole), ["hmm"]);
    }

    #[test]
    fn a_tool_call_goes_pending_in_progress_then_done() {
        let mut live = Live::default();
        let ask = event(EventBody::AgentToolUse {
            tool_call_id: "call_1".into(),
            name: "fetch_url".into(),
            input: json!({"url": "http://example.com/"}),
            evaluated_permission: Permission::Ask,
            mcp: None,
            idempotent: false,
        });
        let id = ask.id;
        let first = wire(&live.update(&ask));
        assert_eq!(first.len(), 1, "an asking call waits: {first:?}");
        assert_eq!(first[0]["sessionUpdate"], "tool_call");
        assert_eq!(first[0]["kind"], "fetch");
        assert_eq!(first[0]["title"], "fetch_url: http://example.com/");
        let granted = wire(&live.update(&event(EventBody::UserToolConfirmation {
            tool_use_id: id.to_string(),
            result: crate::domain::event::Confirmation::Allow,
            deny_message: None,
            tool_call_id: None,
            remember: false,
        })));
        assert_eq!(granted[0]["status"], "in_progress");
        let done = wire(&live.update(&event(EventBody::AgentToolResult {
            tool_use_id: id,
            tool_call_id: "call_1".into(),
            content: vec![Block::text("not allowed")],
            is_error: true,
            structured_content: None,
            mcp: None,
        })));
        assert_eq!(done[0]["status"], "failed");
        assert_eq!(done[0]["content"][0]["content"]["text"], "not allowed");
    }

    #[test]
    fn replay_gives_each_call_once_with_its_final_status() {
        let calc = event(EventBody::AgentToolUse {
            tool_call_id: "call_1".into(),
            name: "calculator".into(),
            input: json!({"expression": "1+1"}),
            evaluated_permission: Permission::Allow,
            mcp: None,
            idempotent: false,
        });
        let events = vec![
            event(EventBody::UserMessage { content: vec![Block::text("hi")] }),
            event(EventBody::AgentMessageDelta { message_id: "msg_1".into(), delta: "ignored".into() }),
            calc.clone(),
            event(EventBody::AgentToolResult {
                tool_use_id: calc.id,
                tool_call_id: "call_1".into(),
                content: vec![Block::text("2")],
                is_error: false,
                structured_content: None,
                mcp: None,
            }),
            event(EventBody::AgentMessage { message_id: "msg_1".into(), content: vec![Block::text("two")] }),
        ];
        let out = wire(&replay(&events));
        let kinds: Vec<&str> = out.iter().map(|u| u["sessionUpdate"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["user_message_chunk", "tool_call", "agent_message_chunk"]);
        assert_eq!(out[1]["status"], "completed");
        assert_eq!(out[1]["content"][0]["content"]["text"], "2");
        assert_eq!(out[2]["content"]["text"], "two");
    }

    #[test]
    fn an_edit_the_client_made_shows_its_diff_and_file_live_and_in_a_replay() {
        use crate::domain::event::{ClientRun, Diff, Location};
        let call = event(EventBody::AgentCustomToolUse {
            tool_call_id: "call_1".into(),
            name: "write_text_file".into(),
            input: json!({"path": "/w/a.txt", "content": "new"}),
            ask: true,
            editor: true,
        });
        let ran = ClientRun {
            by: Some("zed".into()),
            permission: Some(crate::domain::event::Confirmation::Allow),
            locations: vec![Location { path: "/w/a.txt".into(), line: None }],
            diff: Some(Diff { path: "/w/a.txt".into(), old_text: Some("old".into()), new_text: "new".into() }),
            terminal: None,
        };
        let result = event(EventBody::UserCustomToolResult {
            custom_tool_use_id: call.id.to_string(),
            content: vec![Block::text("Wrote 3 bytes to /w/a.txt")],
            is_error: false,
            tool_call_id: None,
            ran: Some(ran),
        });
        let mut live = Live::default();
        let started = wire(&live.update(&call));
        assert_eq!(started[0]["title"], "Write /w/a.txt");
        assert_eq!(started[0]["kind"], "edit");
        assert_eq!(started[0]["locations"], json!([{"path": "/w/a.txt"}]));
        assert!(live.calls[&call.id].ask, "the call says the client asks");
        let done = wire(&live.update(&result));
        let diff = json!({"type": "diff", "path": "/w/a.txt", "oldText": "old", "newText": "new"});
        assert_eq!(done[0]["content"][0], diff);
        assert_eq!(done[0]["content"][1]["content"]["text"], "Wrote 3 bytes to /w/a.txt");
        assert_eq!(done[0]["locations"], json!([{"path": "/w/a.txt"}]));
        let replayed = wire(&replay(&[call, result]));
        assert_eq!((&replayed[0]["content"], &replayed[0]["locations"]), (&done[0]["content"], &done[0]["locations"]));
    }

    #[test]
    fn blocks_from_other_views_render_as_acp_content() {
        let block = |v: Value| serde_json::to_value(content_block(&serde_json::from_value(v).unwrap())).unwrap();
        let link = json!({"type": "resource_link", "uri": "file:///a", "name": "a"});
        assert_eq!(block(link.clone()), link, "an ACP block comes back as it was sent");
        assert_eq!(
            block(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}})),
            json!({"type": "image", "data": "AA==", "mimeType": "image/png"})
        );
        assert_eq!(
            block(json!({"type": "file", "name": "r.csv", "data": "data:text/csv;base64,YQ=="})),
            json!({"type": "text", "text": "[file r.csv (text/csv)]"})
        );
    }
}
