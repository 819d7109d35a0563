//! `GET /meta`: the protocol version and the agents, with their exposed tools, options
//! and capabilities. No key needed, as the protocol allows; agents made through an API are
//! listed to the subject that made them.

use actix_web::{get, HttpResponse};
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::api::State;

/// The protocol version and the agents the caller may use (no key needed).
#[utoipa::path(
    tag = "aap",
    operation_id = "meta",
    security((), ("bearer" = []), ("api_key" = [])),
    responses((status = 200, description = "`{\"version\": 3, \"agents\": [...]}`", body = Object)),
)]
#[get("/meta")]
pub async fn meta(state: State, req: actix_web::HttpRequest) -> HttpResponse {
    let agents = state.sessions.agents();
    // No key is needed here; agents made through an API show only to who may use them.
    let caller = state.auth.caller(crate::api::auth::presented_key(&req)).ok();
    let shown = |agent: &Agent| match &agent.definition {
        None => true,
        Some(definition) => caller.as_ref().is_some_and(|c| c.may_use(&definition.created_by)),
    };
    let list: Vec<Value> =
        agents.all().iter().filter(|agent| shown(agent)).map(|agent| describe(agent, &agents.tools)).collect();
    HttpResponse::Ok().json(json!({"version": 3, "agents": list}))
}

fn describe(agent: &Agent, tools: &crate::agent::Tools) -> Value {
    let exposed: Vec<Value> = agent
        .exposed_tools(tools)
        .filter_map(|name| tools.def(name))
        .map(|def| json!({"name": def.name, "description": def.description, "parameters": def.parameters}))
        .collect();
    let mut out = json!({
        "name": agent.name,
        "version": agent.config.version,
        "tools": exposed,
        "options": agent.config.options,
        "capabilities": {
            "history": {"compacted": {}, "full": {}},
            "stream": {"delta": {}, "message": {}, "none": {}},
            "application": {"tools": {}},
        },
    });
    // Images by address and inline, to a model that takes them; none advertised otherwise.
    if agent.config.model.images {
        out["capabilities"]["image"] = json!({"http": {}, "data": {}});
    }
    if let Some(title) = &agent.config.title {
        out["title"] = json!(title);
    }
    if !agent.config.description.is_empty() {
        out["description"] = json!(agent.config.description);
    }
    out
}
