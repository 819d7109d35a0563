//! `turnlog export`, `import` and `verify`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use super::args::{ExportArgs, ImportArgs, Remote, ServeArgs, VerifyArgs};
use super::{data_dir, input, open_data_dir, progress, run, Failure};
use crate::audit::export::Export;
use crate::audit::format::{self, Line};
use crate::audit::import::{self as audit, ImportError, Imported};
use crate::audit::verify::{self, Verifier};
use crate::client::{Client, ImportStatus, SessionQuery};
use crate::domain::SessionId;
use crate::projection::{SessionIndex, SessionSummary};
use crate::store::sled::SledLog;
use crate::store::{AuditLog, Key, Log, Projections, Store};

/// Where sessions come from or go to.
pub enum Source {
    DataDir(PathBuf),
    Server(Client),
}

impl Source {
    /// The server named, or else the data dir.
    fn of(serve: &ServeArgs, remote: &Remote) -> Result<Source, Failure> {
        match remote.client() {
            Some(client) => Ok(Source::Server(client)),
            None => Ok(Source::DataDir(data_dir(serve)?)),
        }
    }
}

/// `turnlog export`: to standard output, or to a file written aside and renamed once
/// whole, so that a failed export leaves no file.
pub fn export_command(serve: &ServeArgs, args: ExportArgs) -> i32 {
    run("export", async move {
        let selection = Selection { sessions: args.sessions, agent: args.agent, created_by: args.created_by };
        let source = Source::of(serve, &args.remote)?;
        let Some(path) = args.output else {
            return export(&source, &selection, &mut std::io::stdout().lock()).await.map(|_| ());
        };
        let mut aside = path.clone().into_os_string();
        aside.push(".partial");
        let aside = PathBuf::from(aside);
        let mut file =
            std::fs::File::create(&aside).map_err(|e| Failure::Input(format!("{}: {e}", aside.display())))?;
        let written = export(&source, &selection, &mut file).await;
        if written.is_err() {
            let _ = std::fs::remove_file(&aside);
        }
        let count = written?;
        std::fs::rename(&aside, &path).map_err(input)?;
        eprintln!("turnlog export: {count} sessions to {}", path.display());
        Ok(())
    })
}

/// `turnlog import`: says on stderr what became of each session.
pub fn import_command(serve: &ServeArgs, args: ImportArgs) -> i32 {
    run("import", async move {
        for (session, imported) in import(&Source::of(serve, &args.remote)?, &args.file).await? {
            let said = match imported {
                Imported::New { events } => format!("imported, {events} events"),
                Imported::Unchanged { events } => format!("already there, the same {events} events"),
            };
            eprintln!("turnlog import: {session}: {said}");
        }
        Ok(())
    })
}

/// `turnlog verify`: an export file, or else the data dir.
pub fn verify_command(serve: &ServeArgs, args: VerifyArgs) -> i32 {
    run("verify", async move {
        let dir = if args.file.is_none() { Some(data_dir(serve)?) } else { None };
        let checked = verify(args.file.as_deref(), dir.as_deref()).await?;
        let events: u64 = checked.iter().map(|(_, n)| n).sum();
        println!("ok: {} sessions, {events} events, every chain verifies", checked.len());
        Ok(())
    })
}

/// Which sessions an export takes: these, or all that match the filters.
#[derive(Default)]
pub struct Selection {
    pub sessions: Vec<String>,
    pub agent: Option<String>,
    pub created_by: Option<String>,
}

impl Selection {
    fn matches(&self, summary: &SessionSummary) -> bool {
        self.agent.as_ref().is_none_or(|a| &summary.spec.agent.name == a)
            && self.created_by.as_ref().is_none_or(|c| &summary.created_by == c)
    }
}

/// Writes the selected sessions' lines to `out`; the number of sessions written.
pub async fn export(source: &Source, selection: &Selection, out: &mut dyn Write) -> Result<usize, Failure> {
    let named: Vec<SessionId> = selection
        .sessions
        .iter()
        .map(|s| s.parse().map_err(|_| Failure::Input(format!("{s:?} is not a session id"))))
        .collect::<Result<_, _>>()?;
    match source {
        Source::DataDir(dir) => {
            let log = open_data_dir(dir, false)?;
            let result = export_log(log.as_ref(), named, selection, out).await;
            log.close().await.map_err(input)?;
            result
        }
        Source::Server(client) => {
            let sessions = if named.is_empty() { list_server(client, selection).await? } else { named };
            let bar = progress(sessions.len() as u64, "sessions");
            for session in &sessions {
                let body = client.export(&session.to_string()).await?;
                out.write_all(&body).map_err(input)?;
                bar.inc(1);
            }
            bar.finish_and_clear();
            Ok(sessions.len())
        }
    }
}

async fn export_log(
    log: &SledLog,
    named: Vec<SessionId>,
    selection: &Selection,
    out: &mut dyn Write,
) -> Result<usize, Failure> {
    let sessions = if named.is_empty() {
        let mut all = Vec::new();
        loop {
            let page = log.session_ids(all.last().copied(), 1000).await.map_err(input)?;
            if page.is_empty() {
                break;
            }
            all.extend(page);
        }
        let mut chosen = Vec::new();
        for session in all {
            let summary = log.get(SessionIndex::NAME, Key::session(session)).await.map_err(input)?;
            let summary: Option<SessionSummary> = summary.and_then(|bytes| serde_json::from_slice(&bytes).ok());
            // The catalog's log has no summary: it goes with an unfiltered export.
            let filtered = selection.agent.is_some() || selection.created_by.is_some();
            if summary.as_ref().map_or(!filtered, |s| selection.matches(s)) {
                chosen.push(session);
            }
        }
        chosen
    } else {
        named
    };
    let bar = progress(sessions.len() as u64, "sessions");
    for &session in &sessions {
        let mut export = Export::new(session);
        let mut any = false;
        loop {
            let page = export.next(log).await.map_err(|e| Failure::Wrong(e.to_string()))?;
            if page.is_empty() {
                break;
            }
            any = true;
            out.write_all(&page).map_err(input)?;
        }
        if !any {
            return Err(Failure::Input(format!("no session {session} in the log")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(sessions.len())
}

/// The server's sessions that match, through its list (the caller's own, or all for an admin).
async fn list_server(client: &Client, selection: &Selection) -> Result<Vec<SessionId>, Failure> {
    let mut sessions = Vec::new();
    let mut query = SessionQuery {
        limit: Some(100),
        agent: selection.agent.clone(),
        created_by: selection.created_by.clone(),
        after: None,
    };
    loop {
        let page = client.sessions(&query).await?;
        for item in page.sessions {
            let id = item.session_id;
            sessions.push(id.parse().map_err(|_| Failure::Input(format!("the server listed {id:?}")))?);
        }
        match page.next {
            Some(next) => query.after = Some(next),
            None => return Ok(sessions),
        }
    }
}

/// An export file's lines, grouped by session (each session's lines must be together).
fn read_file(path: &Path) -> Result<Vec<Vec<Line>>, Failure> {
    let file = std::fs::File::open(path).map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    let lines = std::io::BufReader::new(file).lines().enumerate().map(|(i, line)| line.map(|line| (i + 1, line)));
    format::group(lines).map_err(|e| Failure::Input(format!("{}: {e}", path.display())))
}

/// Checks every chain in an export file or a data dir; what was checked, per session (the
/// number of events), or the first broken link.
pub async fn verify(file: Option<&Path>, data_dir: Option<&Path>) -> Result<Vec<(SessionId, u64)>, Failure> {
    let mut checked = Vec::new();
    if let Some(file) = file {
        for group in read_file(file)? {
            let mut verifier = Verifier::new(group[0].session_id);
            for line in &group {
                audit::check_line(line).map_err(Failure::Wrong)?;
                verifier
                    .next(line.sequence_number, line.stored(), &line.hash, Some(&line.prev))
                    .map_err(|broken| Failure::Wrong(format!("broken link: {broken}")))?;
            }
            checked.push((group[0].session_id, verifier.head().0));
        }
        return Ok(checked);
    }
    let dir = data_dir.ok_or_else(|| Failure::Input("verify needs a FILE or --data-dir".into()))?;
    let log = open_data_dir(dir, false)?;
    let result = verify_log(log.as_ref(), &mut checked).await;
    log.close().await.map_err(input)?;
    result.map(|()| checked)
}

async fn verify_log(log: &SledLog, checked: &mut Vec<(SessionId, u64)>) -> Result<(), Failure> {
    let mut after = None;
    loop {
        let page = log.session_ids(after, 1000).await.map_err(input)?;
        let Some(last) = page.last().copied() else { return Ok(()) };
        for session in page {
            match verify::verify(log, session).await.map_err(input)? {
                Ok(head) => checked.push((session, head.seq)),
                Err(broken) => return Err(Failure::Wrong(format!("broken link: {broken}"))),
            }
        }
        after = Some(last);
    }
}

/// Loads an export file; what became of each session. The whole file is checked first
/// (every chain, every session at rest, and on a data dir every session the log already
/// holds), so that a file that is refused imports nothing.
pub async fn import(target: &Source, file: &Path) -> Result<Vec<(SessionId, Imported)>, Failure> {
    let groups = read_file(file)?;
    let mut checked = Vec::with_capacity(groups.len());
    for group in &groups {
        checked.push(audit::events_of(group).map_err(import_failure)?);
        audit::at_rest(group).map_err(|error| Failure::Wrong(format!("refused: {error}")))?;
    }
    let bar = progress(groups.len() as u64, "sessions");
    let mut done = Vec::new();
    match target {
        Source::DataDir(dir) => {
            let log = open_data_dir(dir, true)?;
            let mut result = Ok(());
            for (group, events) in groups.iter().zip(&checked) {
                if let Err(error) = audit::compare(log.as_ref(), group[0].session_id, events).await {
                    result = Err(import_failure(error));
                    break;
                }
            }
            let pending = if result.is_ok() { groups.iter().zip(checked).collect() } else { Vec::new() };
            for (group, events) in pending {
                match audit::adopt(&Store::embedded(log.clone()), group[0].session_id, events).await {
                    Ok(imported) => done.push((group[0].session_id, imported)),
                    Err(error) => {
                        result = Err(import_failure(error));
                        break;
                    }
                }
                bar.inc(1);
            }
            log.close().await.map_err(input)?;
            result?;
        }
        Source::Server(client) => {
            for group in &groups {
                done.push(import_one(client, group).await?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok(done)
}

/// One session's lines through a server (one request each, under its body limit).
async fn import_one(client: &Client, group: &[Line]) -> Result<(SessionId, Imported), Failure> {
    let body: Vec<u8> = group
        .iter()
        .flat_map(|line| {
            format::export_line(line.session_id, line.sequence_number, &line.prev, &line.hash, line.stored())
        })
        .collect();
    let answer = client.import(body).await.map_err(|error| match error.refusal().map(|r| r.status.as_u16()) {
        // The file's fault (a broken chain, a session held with other events): 1.
        Some(400 | 409) => Failure::Wrong(format!("refused: {error}")),
        Some(_) => Failure::Input(format!("refused: {error}")),
        None => error.into(),
    })?;
    let session = group[0].session_id;
    let said = answer
        .iter()
        .find(|s| s.session_id == session.to_string())
        .ok_or_else(|| Failure::Input(format!("the server did not answer for {session}")))?;
    let events = said.events as usize;
    Ok((
        session,
        match said.status {
            ImportStatus::Imported => Imported::New { events },
            ImportStatus::Unchanged => Imported::Unchanged { events },
        },
    ))
}

fn import_failure(error: ImportError) -> Failure {
    match error {
        ImportError::Broken(broken) => Failure::Wrong(format!("refused: broken link: {broken}")),
        ImportError::Exists(_) => Failure::Wrong(format!("refused: {error}")),
        other => Failure::Input(other.to_string()),
    }
}
