mod anthropic;
mod fake;
mod llama_cpp;
mod openai;
mod support;
mod turns;
