//! A plan of the work, as the built-in `update_plan` tool takes it: the whole list of steps,
//! each with its status and priority (the shape of an ACP `plan`). The log keeps each call
//! of the tool; the plan of a session is its last one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub entries: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// What the step does, in a line.
    pub content: String,
    pub status: StepStatus,
    #[serde(default)]
    pub priority: Priority,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    InProgress,
    Completed,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    High,
    #[default]
    Medium,
    Low,
}

/// The built-in tool that writes a plan.
pub const TOOL: &str = "update_plan";

/// The most steps a plan may have.
pub const MAX_STEPS: usize = 100;

impl Plan {
    /// The plan a call's input writes, or what is wrong with it (for the model to read).
    pub fn read(input: &serde_json::Value) -> Result<Plan, String> {
        let plan: Plan = serde_json::from_value(input.clone()).map_err(|e| format!("not a plan: {e}"))?;
        if plan.entries.len() > MAX_STEPS {
            return Err(format!("a plan has at most {MAX_STEPS} steps, not {}", plan.entries.len()));
        }
        if let Some(i) = plan.entries.iter().position(|step| step.content.trim().is_empty()) {
            return Err(format!("step {i} says nothing (`content` is empty)"));
        }
        Ok(plan)
    }

    /// `3 steps: 1 completed, 1 in progress, 1 pending`.
    pub fn summary(&self) -> String {
        let count = |status| self.entries.iter().filter(|step| step.status == status).count();
        let steps = match self.entries.len() {
            1 => "1 step".to_string(),
            n => format!("{n} steps"),
        };
        format!(
            "Plan updated, {steps}: {} completed, {} in progress, {} pending",
            count(StepStatus::Completed),
            count(StepStatus::InProgress),
            count(StepStatus::Pending)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plan_reads_and_says_where_it_stands() {
        let input = json!({"entries": [
            {"content": "read the code", "status": "completed", "priority": "high"},
            {"content": "write the fix", "status": "in_progress"},
            {"content": "run the tests", "status": "pending", "priority": "low"},
        ]});
        let plan = Plan::read(&input).unwrap();
        assert_eq!(plan.entries[1].priority, Priority::Medium, "medium unless said");
        assert_eq!(plan.summary(), "Plan updated, 3 steps: 1 completed, 1 in progress, 1 pending");
    }

    #[test]
    fn a_wrong_plan_says_what_is_wrong() {
        let status = Plan::read(&json!({"entries": [{"content": "x", "status": "done"}]})).unwrap_err();
        assert!(status.contains("unknown variant `done`"), "{status}");
        let empty = Plan::read(&json!({"entries": [{"content": " ", "status": "pending"}]})).unwrap_err();
        assert_eq!(empty, "step 0 says nothing (`content` is empty)");
        let many = json!({"entries": vec![json!({"content": "x", "status": "pending"}); MAX_STEPS + 1]});
        assert!(Plan::read(&many).unwrap_err().contains("at most 100 steps"));
        assert!(Plan::read(&json!({"steps": []})).unwrap_err().starts_with("not a plan"));
    }
}
