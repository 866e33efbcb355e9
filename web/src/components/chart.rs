//! A small SVG chart of training loss and accuracy per epoch.

use durable_shared::results::EpochMetrics;
use leptos::prelude::*;

const WIDTH: f64 = 320.0;
const HEIGHT: f64 = 120.0;

fn polyline(points: impl Iterator<Item = (f64, f64)>) -> String {
    points
        .map(|(x, y)| format!("{:.1},{:.1}", x * WIDTH, HEIGHT - y * HEIGHT))
        .collect::<Vec<_>>()
        .join(" ")
}

#[component]
pub fn TrainingChart(history: Vec<EpochMetrics>) -> impl IntoView {
    let n = history.len().max(2) as f64 - 1.0;
    let max_loss = history.iter().map(|m| m.loss).fold(f64::EPSILON, f64::max);
    let loss = polyline(
        history
            .iter()
            .enumerate()
            .map(|(i, m)| (i as f64 / n, m.loss / max_loss)),
    );
    let accuracy = polyline(
        history
            .iter()
            .enumerate()
            .map(|(i, m)| (i as f64 / n, m.accuracy)),
    );
    let last = history.last().copied();
    view! {
        <figure class="chart" data-test="training-chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label="Loss and accuracy per epoch">
                <polyline class="loss" points=loss />
                <polyline class="accuracy" points=accuracy />
            </svg>
            <figcaption>
                <span class="key loss">"loss"</span>
                <span class="key accuracy">"accuracy"</span>
                {last.map(|m| format!(" epoch {}: loss {:.4}, accuracy {:.4}", m.epoch, m.loss, m.accuracy))}
            </figcaption>
        </figure>
    }
}
