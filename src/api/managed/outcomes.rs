//! The session's `outcome_evaluations`, as the SDK's resource has them.

use serde::Serialize;
use utoipa::ToSchema;

/// An outcome's evaluation state, as the SDK's `BetaManagedAgentsOutcomeEvaluationResource`
/// has it: an outcome that needs revision is `running` again (the agent works on), with no
/// `completed_at`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeEvaluation {
    #[serde(rename = "type")]
    #[schema(value_type = String)]
    kind: &'static str,
    outcome_id: String,
    description: String,
    iteration: u32,
    result: String,
    explanation: Option<String>,
    completed_at: Option<String>,
}

impl From<&crate::projection::turns::Evaluated> for OutcomeEvaluation {
    fn from(evaluated: &crate::projection::turns::Evaluated) -> OutcomeEvaluation {
        let (result, completed_at) = match evaluated.result.as_str() {
            "needs_revision" => ("running".to_string(), None),
            terminal => (terminal.to_string(), Some(evaluated.at.clone())),
        };
        OutcomeEvaluation {
            kind: "outcome_evaluation",
            outcome_id: evaluated.outcome_id.clone(),
            description: evaluated.description.clone(),
            iteration: evaluated.iteration,
            result,
            explanation: Some(evaluated.explanation.clone()),
            completed_at,
        }
    }
}
