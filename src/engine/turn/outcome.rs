//! Grading the session's outcome (docs/outcomes.md). The last outcome a client defined
//! (`user.define_outcome`) stands until a verdict ends it; after each turn that ends its turn
//! normally, a grader model call judges the conversation against it, between a
//! `span.outcome_evaluation_start` and a `span.outcome_evaluation_end` that carries the
//! verdict, its explanation and what grading cost.

use std::sync::Arc;

use serde_json::Value;

use super::compact::transcript;
use super::{append, Failure, TurnContext};
use crate::agent::ModelRequest;
use crate::domain::{Block, Event, EventBody, EventId, Message, RawEvent, Usage};

/// What the grader is told.
const INSTRUCTIONS: &str = "You grade an AI agent's work against an outcome its user defined. Read the \
conversation and the outcome, then answer with one word on the first line: SATISFIED if the outcome is \
met, NEEDS_REVISION if the agent could still meet it, or FAILED if it cannot be met. Then explain, in one \
short paragraph.";

/// Evaluations of one outcome, unless its definition says otherwise.
const DEFAULT_ITERATIONS: u32 = 3;
/// The most evaluations an outcome may ask for.
const MAX_ITERATIONS: u32 = 20;

/// The outcome a turn grades, as its definition and the evaluations so far left it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingOutcome {
    pub id: String,
    pub description: String,
    pub rubric: String,
    pub max_iterations: u32,
    /// Evaluations so far.
    pub iteration: u32,
}

impl PendingOutcome {
    /// An outcome as `user.define_outcome` stored it: the managed-agents view's object
    /// (`outcome_id`, `description`, `rubric`, `max_iterations`), or any JSON a native
    /// client sent (a string is its description), named by its event's id.
    fn defined(event: &Event, outcome: &Value) -> PendingOutcome {
        let text = |field: &str| outcome.get(field).and_then(Value::as_str).map(str::to_string);
        let description = match outcome {
            Value::String(text) => text.clone(),
            _ => text("description").unwrap_or_else(|| outcome.to_string()),
        };
        let rubric = outcome.get("rubric").map(|rubric| match rubric.get("content").and_then(Value::as_str) {
            Some(content) => content.to_string(),
            None => rubric.to_string(),
        });
        let asked = outcome.get("max_iterations").and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
        PendingOutcome {
            id: text("outcome_id").unwrap_or_else(|| event.id.to_string()),
            description,
            rubric: rubric.unwrap_or_default(),
            max_iterations: asked.unwrap_or(DEFAULT_ITERATIONS).clamp(1, MAX_ITERATIONS),
            iteration: 0,
        }
    }
}

/// The session's outcome as the actor folds it: the last definition (kept as stored, read
/// only when a turn grades it), and where its evaluations stand. Definitions are appended
/// by the thousand by some clients, so the fold only keeps the last one's bytes.
#[derive(Debug, Default)]
pub struct Outcomes {
    defined: Option<RawEvent>,
    /// The outcome's id and its evaluations so far, once one was evaluated.
    evaluated: Option<(String, u32)>,
    /// A verdict ended it.
    resolved: bool,
}

impl Outcomes {
    /// A new definition replaces the one before.
    pub fn define(&mut self, raw: &RawEvent) {
        *self = Outcomes { defined: Some(raw.clone()), evaluated: None, resolved: false };
    }

    pub fn apply(&mut self, event: &Event) {
        if let EventBody::OutcomeEvaluationEnd { outcome_id, result, .. } = &event.body {
            let count = match &self.evaluated {
                Some((id, count)) if id == outcome_id => count + 1,
                _ => 1,
            };
            self.evaluated = Some((outcome_id.clone(), count));
            self.resolved = result != "needs_revision";
        }
    }

    /// The outcome the next turn grades, if one is defined and no verdict ended it.
    pub fn pending(&self) -> Option<PendingOutcome> {
        if self.resolved {
            return None;
        }
        let event = self.defined.as_ref()?.decode().ok()?;
        let EventBody::UserDefineOutcome { outcome } = &event.body else { return None };
        let mut pending = PendingOutcome::defined(&event, outcome);
        if let Some((id, count)) = &self.evaluated {
            if *id == pending.id {
                pending.iteration = *count;
            }
        }
        Some(pending)
    }
}

/// Grades the turn's outcome, if it has one, recording the evaluation; what it cost goes
/// into the turn's usage. A cancel while grading ends the evaluation `interrupted` and the
/// turn as cancelled.
pub(super) async fn grade(ctx: &mut TurnContext, usage: &mut Usage) -> Result<(), Failure> {
    let Some(outcome) = ctx.outcome.take() else { return Ok(()) };
    let iteration = outcome.iteration;
    let start = EventBody::OutcomeEvaluationStart { outcome_id: outcome.id.clone(), iteration };
    let start = append(ctx, vec![start])?.first().map(|event| event.id);
    let asked = ask(ctx, &outcome).await;
    let (result, explanation, cost) = match asked {
        Ok((verdict, explanation, cost)) if verdict == "needs_revision" && iteration + 1 >= outcome.max_iterations => {
            ("max_iterations_reached".to_string(), explanation, cost)
        }
        Ok(verdict) => verdict,
        Err((Failure::Cancelled, cost)) => ("interrupted".into(), "the turn was cancelled while grading".into(), cost),
        Err((Failure::Model(error), cost)) => {
            let why = format!("the grader could not answer ({error}); it is asked again after the next turn");
            ("needs_revision".into(), why, cost)
        }
        Err((failure, _)) => return Err(failure),
    };
    *usage += cost;
    let cancelled = result == "interrupted";
    append(ctx, vec![end(&outcome, iteration, result, explanation, cost, start)])?;
    if cancelled {
        return Err(Failure::Cancelled);
    }
    Ok(())
}

fn end(
    outcome: &PendingOutcome,
    iteration: u32,
    result: String,
    explanation: String,
    usage: Usage,
    start: Option<EventId>,
) -> EventBody {
    EventBody::OutcomeEvaluationEnd {
        outcome_id: outcome.id.clone(),
        iteration,
        description: outcome.description.clone(),
        result,
        explanation,
        usage,
        outcome_evaluation_start_id: start,
    }
}

/// The grader's verdict (`satisfied`, `needs_revision` or `failed`), its explanation, and
/// what asking cost.
async fn ask(ctx: &TurnContext, outcome: &PendingOutcome) -> Result<(String, String, Usage), (Failure, Usage)> {
    let conversation: String = ctx.history.iter().map(|m| transcript(m)).collect();
    let rubric = match outcome.rubric.is_empty() {
        true => String::new(),
        false => format!("\n\nHow to grade it:\n{}", outcome.rubric),
    };
    let request = ModelRequest {
        system: INSTRUCTIONS.into(),
        messages: vec![
            Arc::new(Message::User { content: vec![Block::text(format!("The conversation:\n\n{conversation}"))] }),
            Arc::new(Message::User {
                content: vec![Block::text(format!("{}{rubric}\n\nIs this outcome met?", outcome.description))],
            }),
        ],
        tools: Vec::new(),
        cancel: ctx.cancel.clone(),
    };
    let (said, cost) = super::model::text(ctx, request).await?;
    let (verdict, explanation) = verdict(&said);
    Ok((verdict.to_string(), explanation, cost))
}

/// The verdict the grader's answer starts with, and the rest as its explanation. An
/// answer that starts with none is `needs_revision`, saying so.
fn verdict(said: &str) -> (&'static str, String) {
    let said = said.trim();
    let lower = said.to_lowercase();
    let found = [
        ("satisfied", "satisfied"),
        ("needs_revision", "needs_revision"),
        ("needs revision", "needs_revision"),
        ("failed", "failed"),
    ]
    .into_iter()
    .find(|(word, _)| lower.starts_with(word));
    let Some((word, verdict)) = found else {
        return ("needs_revision", format!("the grader named no verdict: {said}"));
    };
    let rest = said
        .get(word.len()..)
        .unwrap_or_default()
        .trim_start_matches(|c: char| c.is_whitespace() || c == ':' || c == '.' || c == '-');
    (verdict, if rest.is_empty() { said.to_string() } else { rest.trim().to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_is_the_verdict_and_the_rest_explains_it() {
        assert_eq!(verdict("SATISFIED\nAll three files exist."), ("satisfied", "All three files exist.".into()));
        assert_eq!(verdict("needs revision: the tests fail"), ("needs_revision", "the tests fail".into()));
        assert_eq!(verdict("Failed: no such API"), ("failed", "no such API".into()));
        assert_eq!(verdict("echo: what?").0, "needs_revision");
        assert!(verdict("echo: what?").1.starts_with("the grader named no verdict"));
        assert_eq!(verdict("Satisfied. It works"), ("satisfied", "It works".into()));
    }
}
