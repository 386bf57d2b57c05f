//! The chart written beside the JSON (`contention.svg`).

use std::path::Path;

use redlatch_harness::measure::AnyResult;

use super::report::Record;

/// Two panels: hand-off latency (p50 and p99, log scale) and acquisitions/s of 16 tasks on
/// one name, per library.
pub(crate) fn chart(records: &[Record], path: &Path) -> AnyResult<()> {
    use plotters::prelude::*;

    let handoff: Vec<&Record> = records.iter().filter(|r| r.scenario == "handoff").collect();
    let tasks = records
        .iter()
        .filter(|r| r.scenario == "contended")
        .map(|r| r.tasks)
        .find(|t| *t == 16)
        .or_else(|| {
            records
                .iter()
                .find(|r| r.scenario == "contended")
                .map(|r| r.tasks)
        })
        .unwrap_or(16);
    let contended: Vec<&Record> = records
        .iter()
        .filter(|r| r.scenario == "contended" && r.tasks == tasks)
        .collect();
    let root = SVGBackend::new(path, (1200, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);

    let labels: Vec<&str> = handoff.iter().map(|r| r.library).collect();
    let top = handoff
        .iter()
        .filter_map(|r| r.p99_us)
        .fold(1.0f64, f64::max)
        * 2.0
        / 1000.0;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "hand-off latency, ms (p50 solid, p99 light; log scale)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (0..labels.len()).into_segmented(),
            (0.01f64..top.max(1.0)).log_scale(),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
            _ => String::new(),
        })
        .y_desc("ms")
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(BLUE.mix(0.3).filled())
            .margin(8)
            .data(
                handoff
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i, r.p99_us.unwrap_or_default() / 1000.0)),
            ),
    )?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(BLUE.filled())
            .margin(20)
            .data(
                handoff
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (i, r.p50_us.unwrap_or_default() / 1000.0)),
            ),
    )?;

    let labels: Vec<&str> = contended.iter().map(|r| r.library).collect();
    let top = contended.iter().map(|r| r.ops_per_s).fold(1.0f64, f64::max) * 1.15;
    let caption = format!("{tasks} tasks on one name, empty critical section: acquisitions/s");
    let mut chart = ChartBuilder::on(&right)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d((0..labels.len()).into_segmented(), 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(GREEN.filled())
            .margin(12)
            .data(contended.iter().enumerate().map(|(i, r)| (i, r.ops_per_s))),
    )?;
    root.present()?;
    Ok(())
}
