//! `oxgen generate MODEL PROMPT`: greedy generation, text streamed to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use oxgen::{GenerateOptions, Model, ModelOptions, Prompt};

#[derive(clap::Args)]
pub struct Args {
    /// `[MODEL] PROMPT`: a package folder (model.onnx + genai_config.json + tokenizer.json),
    /// then the user message (rendered with the package's chat template unless --raw). Without
    /// MODEL the default model is used, pulled first if needed.
    #[arg(required = true, num_args = 1..=2, value_names = ["MODEL", "PROMPT"])]
    args: Vec<String>,
    /// Send the prompt as is, without the chat template.
    #[arg(long, env = "OXGEN_RAW")]
    raw: bool,
    /// Stop after this many new tokens.
    #[arg(long, env = "OXGEN_MAX_NEW_TOKENS", default_value_t = 256)]
    max_new_tokens: usize,
    /// Keep generating past end-of-sequence tokens, to --max-new-tokens.
    #[arg(long, env = "OXGEN_IGNORE_EOS")]
    ignore_eos: bool,
    /// Kernel threads (0: every core).
    #[arg(long, env = "OXGEN_THREADS", default_value_t = 0)]
    threads: usize,
    /// f32 activations everywhere, whatever the model's accuracy_level allows.
    #[arg(long, env = "OXGEN_EXACT")]
    exact: bool,
    /// Context to size the KV cache for (default: the package's context length).
    #[arg(long, env = "OXGEN_CTX_SIZE")]
    ctx_size: Option<usize>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let (model_dir, prompt) = match args.args.as_slice() {
        [model, prompt] => (PathBuf::from(model), prompt.clone()),
        [prompt] => (crate::pull::ensure_default_model(false)?, prompt.clone()),
        _ => unreachable!("clap takes one or two positional arguments"),
    };
    let start = Instant::now();
    let options = ModelOptions {
        threads: args.threads,
        context: args.ctx_size,
        exact: args.exact,
    };
    let mut model = Model::open(&model_dir, &options)
        .with_context(|| format!("opening {}", model_dir.display()))?;
    let loaded = start.elapsed();
    let prompt = if args.raw {
        Prompt::Text(prompt)
    } else {
        Prompt::chat(&[("user", &prompt)])
    };
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        ignore_eos: args.ignore_eos,
    };
    let mut stdout = std::io::stdout().lock();
    let mut first_token = None;
    let gen_start = Instant::now();
    let mut write_error = None;
    let out = model.generate(&prompt, &opts, |piece| {
        first_token.get_or_insert_with(|| gen_start.elapsed());
        if write_error.is_none()
            && let Err(e) = stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
        {
            write_error = Some(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    writeln!(stdout)?;
    let total = gen_start.elapsed();
    let ttft = first_token.unwrap_or(total);
    let decode_tokens = out.tokens.len().saturating_sub(1);
    let decode_secs = (total - ttft).as_secs_f64();
    eprintln!(
        "load {:.2}s | prompt {} tokens, first token {:.3}s | {} tokens, {:.1} tok/s decode | stop: {:?}",
        loaded.as_secs_f64(),
        out.prompt_tokens,
        ttft.as_secs_f64(),
        out.tokens.len(),
        if decode_secs > 0.0 {
            decode_tokens as f64 / decode_secs
        } else {
            0.0
        },
        out.stop
    );
    Ok(())
}
