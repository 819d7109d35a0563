//! `GET /meta`: the protocol version and the agents, with their exposed tools, options
//! and capabilities. No key needed, as the protocol allows.

use actix_web::HttpResponse;
use serde_json::{json, Value};

use crate::agent::Agent;
use crate::api::State;

pub async fn meta(state: State) -> HttpResponse {
    let agents = state.sessions.agents();
    let list: Vec<Value> = agents.all().iter().map(|agent| describe(agent, &agents.tools)).collect();
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
            "image": {"http": {}, "data": {}},
        },
    });
    if let Some(title) = &agent.config.title {
        out["title"] = json!(title);
    }
    if !agent.config.description.is_empty() {
        out["description"] = json!(agent.config.description);
    }
    out
}
