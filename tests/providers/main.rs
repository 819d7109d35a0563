mod anthropic;
mod fake;
mod openai;
mod support;
mod turns;
