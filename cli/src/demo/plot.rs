//! The demo's training curve as an SVG chart (`pslite demo --plot FILE.svg`):
//! held-out loss (left axis) and accuracy (right axis) per epoch.
//!
//! Drawn with `plotters`' SVG backend only: text stays SVG `<text>`, so no
//! font or image library is needed on the machine. Each epoch is one marked
//! point on each curve (a `<circle>`), epoch 0 being the untrained model.
//! With `--elastic`, each round after the first is a green vertical line
//! where it began, labelled with its number of workers.

use std::path::Path;

use plotters::prelude::*;

/// One evaluation of the model on the held-out set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// The epoch (0 = before training).
    pub epoch: usize,
    /// Held-out log loss.
    pub loss: f64,
    /// Held-out accuracy.
    pub accuracy: f64,
}

/// An elastic round that began during training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundMark {
    /// The round number.
    pub round: u64,
    /// Epochs trained when it began.
    pub after_epoch: usize,
    /// Its workers.
    pub workers: usize,
}

const ROUND: RGBColor = RGBColor(20, 140, 70);
const LOSS: RGBColor = RGBColor(200, 60, 40);
const ACCURACY: RGBColor = RGBColor(30, 90, 200);

/// Writes the chart of `points` to `path`, titled `title`, with a line
/// where each of `rounds` began (round 0 is not marked).
pub fn write_chart(
    path: &Path,
    title: &str,
    points: &[Point],
    rounds: &[RoundMark],
) -> Result<(), String> {
    let last_epoch = points.iter().map(|p| p.epoch).max().unwrap_or(0).max(1);
    let max_loss = points.iter().map(|p| p.loss).fold(0.0_f64, f64::max);
    let loss_top = if max_loss > 0.0 { max_loss * 1.1 } else { 1.0 };
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| format!("cannot draw the chart: {e}");
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0f64..last_epoch as f64, 0f64..loss_top)
        .map_err(|e| draw(&e))?
        .set_secondary_coord(0f64..last_epoch as f64, 0f64..1f64);
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("held-out loss")
        .x_labels(last_epoch.min(10) + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| draw(&e))?;
    chart
        .configure_secondary_axes()
        .y_desc("held-out accuracy")
        .y_label_formatter(&|y| format!("{y:.1}"))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| draw(&e))?;

    for mark in rounds.iter().filter(|r| r.round > 0) {
        let x = mark.after_epoch as f64;
        chart
            .draw_series(LineSeries::new(
                [(x, 0.0), (x, loss_top)],
                ROUND.stroke_width(2),
            ))
            .map_err(|e| draw(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!(
                    "round {}: {} worker{}",
                    mark.round,
                    mark.workers,
                    if mark.workers == 1 { "" } else { "s" }
                ),
                (
                    x + 0.02 * last_epoch as f64,
                    loss_top * (0.97 - 0.06 * (mark.round % 2) as f64),
                ),
                ("sans-serif", 13).into_font().color(&ROUND),
            )))
            .map_err(|e| draw(&e))?;
    }
    let loss: Vec<(f64, f64)> = points.iter().map(|p| (p.epoch as f64, p.loss)).collect();
    let accuracy: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.epoch as f64, p.accuracy))
        .collect();
    chart
        .draw_series(LineSeries::new(loss.clone(), LOSS.stroke_width(2)))
        .map_err(|e| draw(&e))?
        .label("held-out loss (left axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], LOSS.stroke_width(2)));
    chart
        .draw_series(loss.iter().map(|&p| Circle::new(p, 4, LOSS.filled())))
        .map_err(|e| draw(&e))?;
    chart
        .draw_secondary_series(LineSeries::new(accuracy.clone(), ACCURACY.stroke_width(2)))
        .map_err(|e| draw(&e))?
        .label("held-out accuracy (right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ACCURACY.stroke_width(2)));
    chart
        .draw_secondary_series(
            accuracy
                .iter()
                .map(|&p| Circle::new(p, 4, ACCURACY.filled())),
        )
        .map_err(|e| draw(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| draw(&e))?;
    root.present()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_parses_and_has_one_point_per_epoch_on_each_curve() {
        let dir = std::env::temp_dir().join(format!("pslite-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        let points: Vec<Point> = (0..=7)
            .map(|e| Point {
                epoch: e,
                loss: 0.7 / (1.0 + e as f64),
                accuracy: 0.5 + 0.05 * e as f64,
            })
            .collect();
        let rounds = [
            RoundMark {
                round: 0,
                after_epoch: 0,
                workers: 2,
            },
            RoundMark {
                round: 1,
                after_epoch: 2,
                workers: 3,
            },
            RoundMark {
                round: 2,
                after_epoch: 3,
                workers: 2,
            },
        ];
        write_chart(&path, "test chart", &points, &rounds).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("the chart is not well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let circles = doc
            .descendants()
            .filter(|n| n.has_tag_name("circle"))
            .count();
        assert_eq!(
            circles,
            2 * points.len(),
            "one point per epoch on each curve"
        );
        let texts: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text())
            .collect();
        for label in [
            "epoch",
            "held-out loss",
            "held-out accuracy",
            "test chart",
            "round 1: 3 workers",
            "round 2: 2 workers",
        ] {
            assert!(
                texts.iter().any(|t| t.contains(label)),
                "no {label:?} in {texts:?}"
            );
        }
        assert!(!texts.iter().any(|t| t.contains("round 0")), "{texts:?}");
    }
}
