//! Built-in server tools: `calculator`, `current_time`, `fetch_url` (allow-listed hosts
//! only) and `update_plan` (the model's plan of the work, kept in the log: see
//! [`crate::domain::plan`]). A tool's answer is text; a failure is text too, marked as an error, so the
//! model can read what went wrong.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::model::ToolDef;
use crate::domain::plan::{self, Plan};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSettings {
    pub calculator: BasicTool,
    pub current_time: BasicTool,
    pub fetch_url: FetchSettings,
    pub update_plan: BasicTool,
    #[serde(default)]
    pub mcp: McpSettings,
}

/// What MCP servers declared through an API (not in config) may be, for a caller that is
/// not an admin: never a command, and only a URL on one of these hosts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSettings {
    /// `example.com`, or `*.example.com` for its subdomains.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicTool {
    /// `false`: the tool runs and streams like any other but `/meta` does not list it.
    #[serde(default = "yes")]
    pub exposed: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchSettings {
    #[serde(default = "yes")]
    pub exposed: bool,
    /// Hosts that may be fetched: `example.com`, or `*.example.com` for its subdomains.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    pub timeout_secs: u64,
    pub max_bytes: usize,
}

fn yes() -> bool {
    true
}

pub const NAMES: &[&str] = &["calculator", "current_time", "fetch_url", plan::TOOL];

pub struct Tools {
    settings: ToolSettings,
    http: reqwest::Client,
}

impl Tools {
    pub fn new(settings: ToolSettings) -> Tools {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(settings.fetch_url.timeout_secs))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client with default TLS");
        Tools { settings, http }
    }

    pub fn settings(&self) -> &ToolSettings {
        &self.settings
    }

    pub fn has(&self, name: &str) -> bool {
        NAMES.contains(&name)
    }

    pub fn exposed(&self, name: &str) -> bool {
        match name {
            "calculator" => self.settings.calculator.exposed,
            "current_time" => self.settings.current_time.exposed,
            "fetch_url" => self.settings.fetch_url.exposed,
            plan::TOOL => self.settings.update_plan.exposed,
            _ => false,
        }
    }

    pub fn def(&self, name: &str) -> Option<ToolDef> {
        let (description, parameters) = match name {
            "calculator" => (
                "Evaluates an arithmetic expression: numbers, + - * / % ^ and parentheses.",
                json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
            ),
            "current_time" => {
                ("The current date and time in UTC (RFC 3339).", json!({"type": "object", "properties": {}}))
            }
            "fetch_url" => (
                "Fetches a web page over HTTP(S) from an allowed host and returns its text.",
                json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}),
            ),
            plan::TOOL => (
                "Writes your plan of the work, for the user to follow: the whole list of steps, each with its \
                 status and priority. Call it again with the whole list whenever a step starts or ends.",
                plan_schema(),
            ),
            _ => return None,
        };
        Some(ToolDef { name: name.into(), description: description.into(), parameters })
    }

    /// Runs a tool. `Err` is the text of a failure, for the model to read.
    pub async fn call(&self, name: &str, input: &Value, cancel: &CancellationToken) -> Result<String, String> {
        let started = std::time::Instant::now();
        let result = tokio::select! {
            _ = cancel.cancelled() => Err("Tool call cancelled".to_string()),
            result = self.run(name, input) => result,
        };
        crate::metrics::TOOL_SECONDS.with_label_values(&[name]).observe(started.elapsed().as_secs_f64());
        result
    }

    async fn run(&self, name: &str, input: &Value) -> Result<String, String> {
        match name {
            "calculator" => {
                let expression = input["expression"].as_str().ok_or("calculator needs a string `expression`")?;
                calculate(expression).map(format_number)
            }
            "current_time" => Ok(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            "fetch_url" => self.fetch(input["url"].as_str().ok_or("fetch_url needs a string `url`")?).await,
            plan::TOOL => Plan::read(input).map(|plan| plan.summary()),
            other => Err(format!("there is no server tool named {other:?}")),
        }
    }

    async fn fetch(&self, url: &str) -> Result<String, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("only http and https URLs may be fetched, not {}", parsed.scheme()));
        }
        let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
        if !host_allowed(&self.settings.fetch_url.allowed_hosts, &host) {
            return Err(format!("host {host:?} is not on the allow-list (tools.fetch_url.allowed_hosts)"));
        }
        let mut response = self.http.get(parsed).send().await.map_err(|e| format!("fetch failed: {e}"))?;
        let status = response.status();
        let limit = self.settings.fetch_url.max_bytes;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| format!("fetch failed: {e}"))? {
            body.extend_from_slice(&chunk);
            if body.len() >= limit {
                body.truncate(limit);
                break;
            }
        }
        Ok(format!("HTTP {}\n\n{}", status.as_u16(), String::from_utf8_lossy(&body)))
    }
}

/// The input of `update_plan`: a [`Plan`].
fn plan_schema() -> Value {
    let step = json!({
        "type": "object",
        "properties": {
            "content": {"type": "string", "description": "What the step does, in a line."},
            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
            "priority": {"type": "string", "enum": ["high", "medium", "low"]},
        },
        "required": ["content", "status"],
        "additionalProperties": false,
    });
    json!({
        "type": "object",
        "properties": {"entries": {"type": "array", "items": step, "maxItems": crate::domain::plan::MAX_STEPS}},
        "required": ["entries"],
        "additionalProperties": false,
    })
}

pub(crate) fn host_allowed(allowed: &[String], host: &str) -> bool {
    allowed.iter().any(|pattern| match pattern.strip_prefix("*.") {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => pattern.eq_ignore_ascii_case(host),
    })
}

/// Integral results print without a fraction: `14`, not `14.0`.
fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// A small arithmetic evaluator. Hand-written on purpose: the tool's language is exactly
/// numbers, `+ - * / % ^` and parentheses, and an expression crate would expose a whole
/// scripting language (variables, strings, functions) to whatever the model writes.
pub fn calculate(expression: &str) -> Result<f64, String> {
    let tokens: Vec<char> = expression.chars().filter(|c| !c.is_whitespace()).collect();
    let mut parser = Calc { tokens: &tokens, at: 0, depth: 0 };
    let value = parser.expr()?;
    if parser.at != tokens.len() {
        return Err(format!("unexpected {:?} at position {}", tokens[parser.at], parser.at));
    }
    if !value.is_finite() {
        return Err("the result is not a finite number".into());
    }
    Ok(value)
}

struct Calc<'a> {
    tokens: &'a [char],
    at: usize,
    depth: usize,
}

impl Calc<'_> {
    fn peek(&self) -> Option<char> {
        self.tokens.get(self.at).copied()
    }

    fn expr(&mut self) -> Result<f64, String> {
        let mut value = self.term()?;
        while let Some(op @ ('+' | '-')) = self.peek() {
            self.at += 1;
            let rhs = self.term()?;
            value = if op == '+' { value + rhs } else { value - rhs };
        }
        Ok(value)
    }

    fn term(&mut self) -> Result<f64, String> {
        let mut value = self.unary()?;
        while let Some(op @ ('*' | '/' | '%')) = self.peek() {
            self.at += 1;
            let rhs = self.unary()?;
            if op != '*' && rhs == 0.0 {
                return Err("division by zero".into());
            }
            value = match op {
                '*' => value * rhs,
                '/' => value / rhs,
                _ => value % rhs,
            };
        }
        Ok(value)
    }

    /// `^` binds tighter than a sign on its left (`-2^2` is -4) and is right-associative.
    fn power(&mut self) -> Result<f64, String> {
        let base = self.primary()?;
        if self.peek() == Some('^') {
            self.at += 1;
            let exponent = self.unary()?;
            return Ok(base.powf(exponent));
        }
        Ok(base)
    }

    fn unary(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some('-') => {
                self.at += 1;
                Ok(-self.unary()?)
            }
            Some('+') => {
                self.at += 1;
                self.unary()
            }
            _ => self.power(),
        }
    }

    fn primary(&mut self) -> Result<f64, String> {
        match self.peek() {
            Some('(') => {
                self.depth += 1;
                if self.depth > 64 {
                    return Err("parentheses nest too deeply".into());
                }
                self.at += 1;
                let value = self.expr()?;
                if self.peek() != Some(')') {
                    return Err(format!("expected `)` at position {}", self.at));
                }
                self.at += 1;
                self.depth -= 1;
                Ok(value)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                let start = self.at;
                while self.peek().is_some_and(|c| c.is_ascii_digit() || c == '.') {
                    self.at += 1;
                }
                let text: String = self.tokens[start..self.at].iter().collect();
                text.parse().map_err(|_| format!("{text:?} is not a number"))
            }
            Some(c) => Err(format!("unexpected {c:?} at position {}", self.at)),
            None => Err("the expression ends too early".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calculator_follows_arithmetic() {
        assert_eq!(calculate("2*(3+4)").map(format_number), Ok("14".into()));
        assert_eq!(calculate("1+1").map(format_number), Ok("2".into()));
        assert_eq!(calculate("7/2").map(format_number), Ok("3.5".into()));
        assert_eq!(calculate("-2^2").map(format_number), Ok("-4".into()));
        assert_eq!(calculate("2^3^2").map(format_number), Ok("512".into()));
        assert_eq!(calculate("2^-1").map(format_number), Ok("0.5".into()));
        assert_eq!(calculate(" 10 % 4 - -1 ").map(format_number), Ok("3".into()));
        assert!(calculate("1/0").unwrap_err().contains("division by zero"));
        assert!(calculate("2*(3").unwrap_err().contains("expected `)`"));
        assert!(calculate("x+1").unwrap_err().contains("'x'"));
        assert!(calculate(&"(".repeat(100)).is_err());
    }

    #[test]
    fn hosts_match_exactly_or_by_subdomain() {
        let allowed = vec!["example.com".to_string(), "*.docs.rs".to_string()];
        assert!(host_allowed(&allowed, "example.com"));
        assert!(!host_allowed(&allowed, "evil-example.com"));
        assert!(host_allowed(&allowed, "serde.docs.rs"));
        assert!(!host_allowed(&allowed, "docs.rs.evil.com"));
    }
}
