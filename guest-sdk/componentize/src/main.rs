//! `lambdastore-componentize IN.wasm OUT.wasm`: makes a deployable
//! LambdaStore component out of an application built with
//! `cargo build --release --target wasm32-unknown-unknown`.

use std::fs;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

/// Turn a lambda application's core module into a LambdaStore component.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// The core module (target/wasm32-unknown-unknown/release/<app>.wasm).
    input: PathBuf,
    /// Where to write the component.
    output: PathBuf,
}

fn run(cli: &Cli) -> Result<()> {
    let core = fs::read(&cli.input).with_context(|| format!("cannot read {}", cli.input.display()))?;
    let component = lambdastore_componentize::componentize(&core)
        .with_context(|| format!("{} is not a valid lambda", cli.input.display()))?;
    fs::write(&cli.output, component).with_context(|| format!("cannot write {}", cli.output.display()))?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lambdastore-componentize: {e:#}");
            ExitCode::FAILURE
        }
    }
}
