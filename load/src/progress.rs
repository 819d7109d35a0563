//! Progress bars for the long phases (indicatif), drawn on stderr only when it is a
//! terminal and the run is not quiet, so reports and test output stay clean.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `len` items.
pub fn bar(quiet: bool, len: u64, message: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:32}] {human_pos}/{human_len} ({per_sec}, {eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    bar
}

/// A bar over a timed phase of `duration`, that moves by itself until finished.
pub fn timed(quiet: bool, duration: Duration, message: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(duration.as_millis() as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:32}] {elapsed}/{duration}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    let ticker = bar.clone();
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        while !ticker.is_finished() {
            ticker.set_position(started.elapsed().as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    bar
}
