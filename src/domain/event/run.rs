//! How a client ran a call of one of its tools, beyond the result the model reads: who ran
//! it, what the user answered when the client asked first, the files it touched, the edit
//! it made and the command it ran. Views that show more than the result (an editor's diff
//! review, a terminal's output) render it, and so does a replay of the log.

use serde::{Deserialize, Serialize};

use super::Confirmation;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientRun {
    /// Who ran it: the client as it named itself (an editor's `clientInfo.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The user's answer, when the client asked before it ran the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission: Option<Confirmation>,
    /// The files the call read or wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locations: Vec<Location>,
    /// The edit it made (the texts only where both together are small enough to keep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<Diff>,
    /// The command it ran, and how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalRun>,
}

/// A file a call touched, and the line it starts at, where one was given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Location {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// A file's text before (`None`: the file was new) and after an edit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diff {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_text: Option<String>,
    pub new_text: String,
}

/// A command run in the client's terminal: what ran, where, and how it ended (an exit
/// code, or the signal that stopped it). What it printed is the result's content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TerminalRun {
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The client kept only the end of the output.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// It ran past its time and was killed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}
