//! What the demo shows while it trains: on a terminal, a progress bar of
//! worker 0's minibatches, redrawn in place below the lines printed
//! (indicatif); elsewhere (a pipe, a file, CI) plain lines only, no bar.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The demo's output on stdout.
pub struct Progress {
    /// Draw a bar (stdout is a terminal).
    terminal: bool,
    /// The bar, once there is progress to show.
    bar: Option<ProgressBar>,
    /// Epochs in the run.
    epochs: usize,
}

impl Progress {
    /// Output for a run of `epochs` epochs; a bar only on a terminal.
    pub fn new(epochs: usize) -> Progress {
        Progress {
            terminal: std::io::stdout().is_terminal(),
            bar: None,
            epochs,
        }
    }

    /// Prints `line` (above the bar, if one is shown).
    pub fn println(&self, line: impl AsRef<str>) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{}", line.as_ref()),
        }
    }

    /// Worker 0 is `done` of `total` minibatches into epoch `epoch`.
    pub fn update(&mut self, epoch: usize, done: usize, total: usize) {
        if !self.terminal {
            return;
        }
        let epochs = self.epochs;
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stdout());
            // The template is a constant: it parses.
            if let Ok(style) =
                ProgressStyle::with_template("epoch {prefix}  [{bar:30}] {pos}/{len} minibatches")
            {
                bar.set_style(style.progress_chars("#>."));
            }
            bar
        });
        bar.set_prefix(format!(
            "{epoch:>w$}/{epochs}",
            w = epochs.to_string().len()
        ));
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    }

    /// Removes the bar: what follows is the summary.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
