//! The editor's files and terminals as tools. When the client says at `initialize` that it
//! can (`fs.readTextFile`, `fs.writeTextFile`, `terminal`), a new session declares them as
//! client tools: the model calls them like any tool, the log records each call as waiting
//! for the client, and the prompt runs it here over ACP (`fs/*`, `terminal/*`), asking the
//! user first where the call says to (the session's mode), then stores the result with how
//! it ran ([`ClientRun`]: who, the answer, the files, the edit, the command and its end).
//!
//! An edit shows as a `diff` (the file's text before and after) when the user is asked,
//! and once it is written; a command's terminal is embedded in its call while it runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_client_protocol::v1::schema::{
    ClientCapabilities, CreateTerminalRequest, Diff as AcpDiff, KillTerminalRequest, PermissionOption,
    PermissionOptionKind, ReadTextFileRequest, ReleaseTerminalRequest, SessionUpdate, Terminal, TerminalExitStatus,
    TerminalOutputRequest, ToolCallContent, ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields,
    WaitForTerminalExitRequest, WriteTextFileRequest,
};
use serde_json::{json, Value};

use super::line::{self, Answer, Line};
use crate::domain::event::{ClientRun, ClientTool, Confirmation, Diff, Location, TerminalRun};
use crate::domain::{Block, EventId};
use crate::session::Input;

pub const READ: &str = "read_text_file";
pub const WRITE: &str = "write_text_file";
pub const TERMINAL: &str = "terminal";

/// The most of a file a read gives the model (it reads the rest by `line` and `limit`).
const READ_MAX: usize = 256 * 1024;
/// The largest edit whose texts the log keeps (both texts together); of a larger one, the
/// log keeps where it was.
const DIFF_MAX: usize = 384 * 1024;
/// The most of a command's output the client keeps (its end).
const OUTPUT_MAX: u64 = 64 * 1024;
/// How long a command runs before it is killed, unless the call says; and the longest.
const COMMAND_TIME: Duration = Duration::from_secs(120);
const COMMAND_TIME_MAX: Duration = Duration::from_secs(600);

/// What the client can do for its sessions, as it said at `initialize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offered {
    pub read: bool,
    pub write: bool,
    pub terminal: bool,
}

impl Offered {
    pub fn of(capabilities: &ClientCapabilities) -> Offered {
        Offered {
            read: capabilities.fs.read_text_file,
            write: capabilities.fs.write_text_file,
            terminal: capabilities.terminal,
        }
    }

    fn has(self, tool: &str) -> bool {
        match tool {
            READ => self.read,
            WRITE => self.write,
            TERMINAL => self.terminal,
            _ => false,
        }
    }

    /// The tools a new session declares: those the client can run.
    pub fn tools(self) -> Vec<ClientTool> {
        let path = json!({"type": "string", "description": "An absolute path, or one relative to the editor's working directory."});
        let tool = |name: &str, title: &str, description: &str, properties: Value, required: &[&str]| ClientTool {
            name: name.to_string(),
            title: Some(title.to_string()),
            description: description.to_string(),
            input_schema: json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false}),
            editor: true,
        };
        let mut tools = Vec::new();
        if self.read {
            tools.push(tool(
                READ,
                "Read a file",
                "Reads a text file as the editor has it (unsaved changes included). Give `line` (1-based) and \
                 `limit` to read part of a long file.",
                json!({
                    "path": path,
                    "line": {"type": "integer", "minimum": 1, "description": "The first line to read (1-based)."},
                    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read."},
                }),
                &["path"],
            ));
        }
        if self.write {
            tools.push(tool(
                WRITE,
                "Write a file",
                "Writes a text file in the editor, whole (made if it does not exist). The user may review the \
                 edit first, and may refuse it.",
                json!({"path": path, "content": {"type": "string", "description": "The file's whole new text."}}),
                &["path", "content"],
            ));
        }
        if self.terminal {
            tools.push(tool(
                TERMINAL,
                "Run a command",
                "Runs a command in the editor's terminal, waits for it to exit, and gives its output (the end of \
                 it, if long) and its exit code. It is killed if it runs past `timeout_secs` (default 120).",
                json!({
                    "command": {"type": "string", "description": "The program to run."},
                    "args": {"type": "array", "items": {"type": "string"}, "description": "Its arguments."},
                    "cwd": {"type": "string", "description": "Where to run it (default: the editor's working directory)."},
                    "timeout_secs": {"type": "integer", "minimum": 1, "maximum": COMMAND_TIME_MAX.as_secs()},
                }),
                &["command"],
            ));
        }
        tools
    }
}

/// A call's input, read.
#[derive(Debug, PartialEq)]
enum Asked {
    Read { path: PathBuf, line: Option<u32>, limit: Option<u32> },
    Write { path: PathBuf, content: String },
    Run { command: String, args: Vec<String>, cwd: Option<PathBuf>, timeout: Duration },
}

/// Reads a call of one of the editor's tools; `cwd` resolves relative paths. `Err`: what
/// is wrong with it, for the model.
fn read_call(tool: &str, input: &Value, cwd: Option<&Path>) -> Result<Asked, String> {
    let string = |key: &str| input.get(key).and_then(Value::as_str);
    let number = |key: &str| -> Result<Option<u64>, String> {
        match input.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => {
                value.as_u64().filter(|n| *n >= 1).map(Some).ok_or(format!("`{key}` must be a whole number from 1"))
            }
        }
    };
    let path = |key: &str| -> Result<PathBuf, String> {
        let given = string(key).filter(|p| !p.is_empty()).ok_or(format!("`{key}` (a path) is needed"))?;
        match (Path::new(given), cwd) {
            (path, _) if path.is_absolute() => Ok(path.to_path_buf()),
            (path, Some(cwd)) => Ok(cwd.join(path)),
            (_, None) => Err(format!("`{key}` must be an absolute path: the editor gave no working directory")),
        }
    };
    let line = |key: &str| -> Result<Option<u32>, String> {
        number(key)?.map(|n| u32::try_from(n).map_err(|_| format!("`{key}` is too large"))).transpose()
    };
    match tool {
        READ => Ok(Asked::Read { path: path("path")?, line: line("line")?, limit: line("limit")? }),
        WRITE => {
            let content = string("content").ok_or("`content` (the file's whole new text) is needed")?;
            Ok(Asked::Write { path: path("path")?, content: content.to_string() })
        }
        TERMINAL => {
            let command = string("command").filter(|c| !c.is_empty()).ok_or("`command` is needed")?.to_string();
            let args = match input.get("args") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(args)) => args
                    .iter()
                    .map(|a| a.as_str().map(str::to_string).ok_or("`args` must be strings"))
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err("`args` must be a list of strings".into()),
            };
            let cwd = match string("cwd") {
                Some(_) => Some(path("cwd")?),
                None => cwd.map(Path::to_path_buf),
            };
            let timeout = match number("timeout_secs")? {
                Some(secs) if secs > COMMAND_TIME_MAX.as_secs() => {
                    return Err(format!("`timeout_secs` is at most {}", COMMAND_TIME_MAX.as_secs()))
                }
                Some(secs) => Duration::from_secs(secs),
                None => COMMAND_TIME,
            };
            Ok(Asked::Run { command, args, cwd, timeout })
        }
        other => Err(format!("{other:?} is not one of the editor's tools ({READ}, {WRITE}, {TERMINAL})")),
    }
}

/// How a call of one of the editor's tools shows: `Read /a/b.rs`, `Write /a/b.rs`,
/// `Run ls -la`.
pub fn title(name: &str, input: &Value) -> Option<String> {
    let string = |key: &str| input.get(key).and_then(Value::as_str);
    match name {
        READ => Some(format!("Read {}", string("path")?)),
        WRITE => Some(format!("Write {}", string("path")?)),
        TERMINAL => {
            let args = input.get("args").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            Some(std::iter::once(string("command")?).chain(args).fold("Run".to_string(), |t, a| t + " " + a))
        }
        _ => None,
    }
}

/// The file a call of one of the editor's tools names, where it is absolute.
pub fn locations(name: &str, input: &Value) -> Vec<ToolCallLocation> {
    let path = input.get("path").and_then(Value::as_str).filter(|p| Path::new(p).is_absolute());
    match (name, path) {
        (READ | WRITE, Some(path)) => {
            let line = input.get("line").and_then(Value::as_u64).and_then(|l| u32::try_from(l).ok());
            vec![ToolCallLocation::new(path).line(line)]
        }
        _ => Vec::new(),
    }
}

/// What the log's record of a run shows in the editor: the edit as a diff, the files.
pub fn shown(ran: &ClientRun) -> (Vec<ToolCallContent>, Vec<ToolCallLocation>) {
    let content = ran
        .diff
        .iter()
        .map(|diff| ToolCallContent::Diff(AcpDiff::new(&diff.path, &diff.new_text).old_text(diff.old_text.clone())))
        .collect();
    let locations = ran.locations.iter().map(|l| ToolCallLocation::new(&l.path).line(l.line)).collect();
    (content, locations)
}

/// What became of a call of one of the editor's tools.
pub enum Ran {
    /// Its result, to store.
    Stored(Input),
    /// The prompt was cancelled meanwhile (the user's answer too).
    Cancelled,
}

const ALLOW: &str = "allow-once";

/// The editor, as a prompt sees it: the tools its client can run now, the name the client
/// gave itself, and the session's working directory (relative paths start there).
#[derive(Debug, Clone, Default)]
pub struct Editor {
    pub offered: Offered,
    pub client_name: Option<String>,
    pub cwd: Option<PathBuf>,
}

/// A call of one of the editor's tools, as the log recorded it, and as the client's
/// permission dialog shows it.
pub struct Call<'a> {
    pub id: EventId,
    pub name: &'a str,
    pub input: &'a Value,
    /// The client asks the user first (the session's mode says to).
    pub ask: bool,
    pub shown: ToolCallUpdate,
}

impl Editor {
    /// Runs a call of one of the editor's tools on the client, asking first if the call says
    /// to; its result, to store. A tool the client did not offer, or a call that does not
    /// read, gets an error result saying so.
    pub async fn run(&self, client: &Line<'_>, call: Call<'_>) -> Ran {
        let id = call.id;
        let mut ran = ClientRun { by: self.client_name.clone(), ..ClientRun::default() };
        if !self.offered.has(call.name) {
            let text = format!("{} is the editor's, and this editor does not offer it now", call.name);
            return Ran::Stored(result(id, text, true, ran));
        }
        let asked = match read_call(call.name, call.input, self.cwd.as_deref()) {
            Ok(asked) => asked,
            Err(why) => return Ran::Stored(result(id, format!("Invalid call of {}: {why}", call.name), true, ran)),
        };
        let location = |path: &Path, line| Location { path: path.display().to_string(), line };
        match asked {
            Asked::Read { path, line, limit } => {
                ran.locations = vec![location(&path, line)];
                if let Some(stored) = permit(client, &call, &mut ran, Vec::new()).await {
                    return stored;
                }
                let request = ReadTextFileRequest::new(client.session.to_string(), path).line(line).limit(limit);
                match client.request(request).await {
                    None => Ran::Cancelled,
                    Some(Ok(read)) => Ran::Stored(result(id, cut(read.content, READ_MAX), false, ran)),
                    Some(Err(error)) => {
                        Ran::Stored(result(id, format!("The editor could not read it: {error}"), true, ran))
                    }
                }
            }
            Asked::Write { path, content } => {
                ran.locations = vec![location(&path, None)];
                // The text before, for the diff (none: a new file, or one the editor cannot read).
                let before = match self.offered.read {
                    true => {
                        match client.request(ReadTextFileRequest::new(client.session.to_string(), path.clone())).await {
                            None => return Ran::Cancelled,
                            Some(read) => read.ok().map(|read| read.content),
                        }
                    }
                    false => None,
                };
                let review = vec![ToolCallContent::Diff(AcpDiff::new(&path, &content).old_text(before.clone()))];
                if let Some(stored) = permit(client, &call, &mut ran, review).await {
                    return stored;
                }
                // Not given up on a cancel once asked for: the file may be written, and the log
                // is to say so (the prompt then stops the turn).
                let (written, path_text) = (content.len(), path.display().to_string());
                let write = WriteTextFileRequest::new(client.session.to_string(), path, content.clone());
                match client.request_anyway(write).await {
                    Ok(_) => {
                        // The edit made, as the editor reviews it (the texts only if they fit).
                        let size = content.len() + before.as_ref().map_or(0, String::len);
                        ran.diff = (size <= DIFF_MAX).then(|| Diff {
                            path: path_text.clone(),
                            old_text: before,
                            new_text: content,
                        });
                        Ran::Stored(result(id, format!("Wrote {written} bytes to {path_text}"), false, ran))
                    }
                    Err(error) => Ran::Stored(result(id, format!("The editor could not write it: {error}"), true, ran)),
                }
            }
            Asked::Run { command, args, cwd, timeout } => {
                if let Some(stored) = permit(client, &call, &mut ran, Vec::new()).await {
                    return stored;
                }
                run_command(client, id, ran, command, args, cwd, timeout).await
            }
        }
    }
}

/// Asks the user, if the call says to, showing `review` (an edit's diff); records the
/// answer in `ran`. `Some`: what to do instead of running the call (refused, cancelled).
async fn permit(client: &Line<'_>, call: &Call<'_>, ran: &mut ClientRun, review: Vec<ToolCallContent>) -> Option<Ran> {
    let id = call.id;
    if call.ask {
        let mut update = call.shown.clone();
        let locations = ran.locations.iter().map(|l| ToolCallLocation::new(&l.path).line(l.line)).collect();
        update.fields.content = Some(review);
        update.fields.locations = Some(locations);
        let options = vec![
            PermissionOption::new(ALLOW, "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new(line::REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        ];
        match client.ask(update, options).await {
            Answer::Cancelled => return Some(Ran::Cancelled),
            Answer::Chose(option) if option == ALLOW => ran.permission = Some(Confirmation::Allow),
            Answer::Chose(_) => {
                ran.permission = Some(Confirmation::Deny);
                let text = "Tool call denied: the user refused it".to_string();
                return Some(Ran::Stored(result(id, text, true, ran.clone())));
            }
            Answer::Failed(error) => {
                let text = format!("Tool call not run: the editor could not ask the user ({error})");
                return Some(Ran::Stored(result(id, text, true, ran.clone())));
            }
        }
    }
    client.notify(status(id, ToolCallStatus::InProgress, None));
    None
}

/// Runs a command in a terminal of the client's, embedded in the call while it runs,
/// until it exits (or is killed at `timeout`, or when the prompt is cancelled); its output
/// and how it ended. Once asked for, the command is recorded whatever happens: it may have
/// run.
async fn run_command(
    client: &Line<'_>,
    id: EventId,
    mut ran: ClientRun,
    command: String,
    args: Vec<String>,
    cwd: Option<PathBuf>,
    timeout: Duration,
) -> Ran {
    let session = client.session.to_string();
    let create = CreateTerminalRequest::new(session.clone(), command.clone())
        .args(args.clone())
        .cwd(cwd.clone())
        .output_byte_limit(OUTPUT_MAX);
    let terminal = match client.request_anyway(create).await {
        Ok(created) => created.terminal_id,
        Err(error) => return Ran::Stored(result(id, format!("The editor could not run it: {error}"), true, ran)),
    };
    client.notify(status(
        id,
        ToolCallStatus::InProgress,
        Some(ToolCallContent::Terminal(Terminal::new(terminal.clone()))),
    ));
    let wait = WaitForTerminalExitRequest::new(session.clone(), terminal.clone());
    let (mut timed_out, mut cancelled) = (false, false);
    let exit = match tokio::time::timeout(timeout, client.request(wait)).await {
        Ok(Some(Ok(exited))) => Ok(exited.exit_status),
        Ok(Some(Err(error))) => Err(error.to_string()),
        Ok(None) | Err(_) => {
            // Cancelled, or past its time: killed (its output so far is kept).
            timed_out = !client.cancel.is_cancelled();
            cancelled = !timed_out;
            let kill = KillTerminalRequest::new(session.clone(), terminal.clone());
            if let Err(error) = client.request_anyway(kill).await {
                tracing::warn!(session_id = %session, %error, "the editor did not kill a command's terminal");
            }
            Err("killed".into())
        }
    };
    let output = client.request_anyway(TerminalOutputRequest::new(session.clone(), terminal.clone())).await;
    let released = client.request_anyway(ReleaseTerminalRequest::new(session.clone(), terminal)).await;
    if let Err(error) = released {
        tracing::debug!(session_id = %session, %error, "a terminal was not released");
    }
    let (output, truncated) = match output {
        Ok(output) => (output.output, output.truncated),
        Err(error) => (format!("(the editor gave no output: {error})"), false),
    };
    let (exit_code, signal) = match &exit {
        Ok(TerminalExitStatus { exit_code, signal, .. }) => (*exit_code, signal.clone()),
        Err(_) => (None, None),
    };
    let ended = match (&exit, timed_out) {
        _ if cancelled => "killed: the prompt was cancelled".to_string(),
        (_, true) => format!("killed after {} s", timeout.as_secs()),
        (Ok(_), _) if exit_code == Some(0) => "exit code 0".to_string(),
        (Ok(_), _) => match (exit_code, &signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("stopped by {signal}"),
            (None, None) => "ended".to_string(),
        },
        (Err(error), _) => format!("the editor lost it: {error}"),
    };
    let failed = exit_code != Some(0);
    let text = format!("{}{output}\n[{ended}]", if truncated { "(the start is cut)\n" } else { "" });
    let cwd = cwd.map(|c| c.display().to_string());
    ran.terminal = Some(TerminalRun { command, args, cwd, truncated, exit_code, signal, timed_out });
    Ran::Stored(result(id, text, failed, ran))
}

/// A result of one of the editor's tools made short enough for any server: its text cut to
/// 4 KiB, saying so, and the run without the edit's texts. `None` for other input.
pub fn shorter(input: &Input) -> Option<Input> {
    const KEPT: usize = 4 * 1024;
    let Input::Result { call, content, is_error, ran: Some(ran) } = input else { return None };
    let text = Block::join_text(content);
    let cut = (0..=KEPT.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    let text = format!(
        "{}\n[cut at {cut} of {} bytes: the whole result is more than the log takes]",
        &text[..cut],
        text.len()
    );
    let ran = ClientRun { diff: None, ..(**ran).clone() };
    Some(Input::Result {
        call: call.clone(),
        content: vec![Block::text(text)],
        is_error: *is_error,
        ran: Some(Box::new(ran)),
    })
}

fn result(id: EventId, text: String, is_error: bool, ran: ClientRun) -> Input {
    Input::Result { call: id.to_string(), content: vec![Block::text(text)], is_error, ran: Some(Box::new(ran)) }
}

fn status(id: EventId, status: ToolCallStatus, content: Option<ToolCallContent>) -> SessionUpdate {
    let fields = ToolCallUpdateFields::new().status(status).content(content.map(|c| vec![c]));
    SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id.to_string(), fields))
}

/// `text`, cut to `max` bytes (at a character), saying so.
fn cut(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let end = (0..=max).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    format!("{}\n[cut at {max} of {} bytes: read the rest with `line` and `limit`]", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_read_with_paths_resolved_and_clear_errors() {
        let cwd = Path::new("/work/app");
        let read = read_call(READ, &json!({"path": "src/main.rs", "line": 3}), Some(cwd)).unwrap();
        assert_eq!(read, Asked::Read { path: "/work/app/src/main.rs".into(), line: Some(3), limit: None });
        assert_eq!(
            read_call(READ, &json!({"path": "a"}), None).unwrap_err(),
            "`path` must be an absolute path: the editor gave no working directory"
        );
        assert_eq!(
            read_call(READ, &json!({"path": "/a", "line": 0}), None).unwrap_err(),
            "`line` must be a whole number from 1"
        );
        assert_eq!(
            read_call(WRITE, &json!({"path": "/a"}), None).unwrap_err(),
            "`content` (the file's whole new text) is needed"
        );
        let run = read_call(TERMINAL, &json!({"command": "ls", "args": ["-a"]}), Some(cwd)).unwrap();
        assert_eq!(
            run,
            Asked::Run { command: "ls".into(), args: vec!["-a".into()], cwd: Some(cwd.into()), timeout: COMMAND_TIME }
        );
        assert_eq!(
            read_call(TERMINAL, &json!({"command": "ls", "args": [1]}), None).unwrap_err(),
            "`args` must be strings"
        );
        assert_eq!(
            read_call(TERMINAL, &json!({"command": "ls", "timeout_secs": 601}), None).unwrap_err(),
            "`timeout_secs` is at most 600"
        );
        assert!(read_call("rm", &json!({"command": "ls"}), None)
            .unwrap_err()
            .contains("not one of the editor's tools"));
    }

    #[test]
    fn only_what_the_client_offers_is_declared() {
        let names = |o: Offered| o.tools().into_iter().map(|t| t.name).collect::<Vec<_>>();
        assert_eq!(names(Offered::default()), Vec::<String>::new());
        assert_eq!(names(Offered { read: true, write: false, terminal: true }), [READ, TERMINAL]);
        assert_eq!(title(TERMINAL, &json!({"command": "ls", "args": ["-la", "/tmp"]})).unwrap(), "Run ls -la /tmp");
        assert_eq!(cut("héllo".into(), 2), "h\n[cut at 2 of 6 bytes: read the rest with `line` and `limit`]");
    }

    #[test]
    fn a_result_too_large_to_store_is_kept_shorter_without_the_edits_texts() {
        let diff = Diff { path: "/a".into(), old_text: Some("x".repeat(9000)), new_text: "y".into() };
        let ran = ClientRun { by: Some("zed".into()), diff: Some(diff), ..ClientRun::default() };
        let long = result(EventId(ulid::Ulid::nil()), "é".repeat(5000), false, ran);
        let Some(Input::Result { content, ran: Some(ran), is_error: false, .. }) = shorter(&long) else { panic!() };
        let text = Block::join_text(&content);
        assert!(
            text.ends_with("\n[cut at 4096 of 10000 bytes: the whole result is more than the log takes]"),
            "{text}"
        );
        assert_eq!((ran.by.as_deref(), ran.diff), (Some("zed"), None));
        assert!(shorter(&Input::Interrupt).is_none());
    }
}
