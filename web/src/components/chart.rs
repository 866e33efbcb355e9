//! Small SVG charts: training loss and accuracy per epoch, a task's progress over time, and the
//! server's throughput from its `/metrics`.

use std::collections::VecDeque;

use durable_shared::results::EpochMetrics;
use leptos::prelude::*;

use crate::state::TimelineEntry;

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

/// A task's progress over the time of its timeline's events: a line that climbs, flattens
/// while paused, and shows a resumed task picking up where it stopped.
#[component]
pub fn ProgressChart(timeline: Vec<TimelineEntry>) -> impl IntoView {
    let points: Vec<(f64, f64)> = timeline
        .iter()
        .filter(|e| e.total > 0)
        .filter_map(|e| Some((seconds_of_day(&e.at)?, e.progress as f64 / e.total as f64)))
        .collect();
    let (first, last) = (points.first().map(|p| p.0), points.last().map(|p| p.0));
    let span = match (first, last) {
        (Some(first), Some(last)) if last > first => last - first,
        _ => return None,
    };
    let first = first.unwrap_or_default();
    let line = polyline(points.iter().map(|(t, p)| ((t - first) / span, *p)));
    Some(view! {
        <figure class="chart" data-test="progress-chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label="Progress over time">
                <polyline class="progress" points=line />
            </svg>
            <figcaption>{format!("progress over {span:.1} s of events")}</figcaption>
        </figure>
    })
}

/// Seconds since midnight of a timeline time (`HH:MM:SS.mmm`).
fn seconds_of_day(at: &str) -> Option<f64> {
    let mut parts = at.split(':');
    let hours: f64 = parts.next()?.parse().ok()?;
    let minutes: f64 = parts.next()?.parse().ok()?;
    let seconds: f64 = parts.next()?.parse().ok()?;
    Some(hours * 3600.0 + minutes * 60.0 + seconds)
}

/// How often `/metrics` is read, and how many readings the chart keeps (five minutes).
const METRICS_EVERY_MS: i32 = 5_000;
const METRICS_KEPT: usize = 60;

/// The sum of every series of metric `name` in a Prometheus text exposition.
fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let series_name = series.split('{').next()?;
            (series_name == name).then(|| value.parse().ok()).flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// One reading of the server's counters: when (ms, the page's clock), steps committed, events
/// stored for clients.
#[derive(Clone, Copy, PartialEq)]
struct Reading {
    at_ms: f64,
    steps: f64,
    events: f64,
}

/// The server's throughput, read from its `/metrics` every few seconds: steps committed and
/// events stored per second. Not shown when the server has no `/metrics` for this page.
#[component]
pub fn ServerChart() -> impl IntoView {
    let readings = RwSignal::new(VecDeque::<Reading>::new());
    let available = RwSignal::new(false);
    leptos::task::spawn_local(async move {
        loop {
            let reading = async {
                let response = gloo_net::http::Request::get("/metrics").send().await.ok()?;
                let text = response.ok().then_some(response)?.text().await.ok()?;
                Some(Reading {
                    at_ms: js_sys::Date::now(),
                    steps: metric_sum(&text, "durable_steps_committed_total").unwrap_or(0.0),
                    events: metric_sum(&text, "durable_events_appended_total").unwrap_or(0.0),
                })
            };
            let reading = reading.await;
            if readings
                .try_update(|kept| {
                    if let Some(reading) = reading {
                        kept.push_back(reading);
                        if kept.len() > METRICS_KEPT {
                            kept.pop_front();
                        }
                    }
                })
                .is_none()
            {
                // The chart is gone.
                return;
            }
            available.set(reading.is_some());
            crate::sync::sleep(METRICS_EVERY_MS).await;
        }
    });
    // Per second between consecutive readings (a restarted server's counters start again at
    // zero: that interval is left out).
    let rates = move |of: fn(&Reading) -> f64| {
        readings.with(|kept| {
            kept.iter()
                .zip(kept.iter().skip(1))
                .filter(|(a, b)| of(b) >= of(a) && b.at_ms > a.at_ms)
                .map(|(a, b)| (of(b) - of(a)) * 1000.0 / (b.at_ms - a.at_ms))
                .collect::<Vec<f64>>()
        })
    };
    let line = move |rates: Vec<f64>| {
        let top = rates.iter().copied().fold(1.0, f64::max);
        let n = (rates.len().max(2) - 1) as f64;
        polyline(
            rates
                .iter()
                .enumerate()
                .map(|(i, r)| (i as f64 / n, r / top)),
        )
    };
    let latest = move |of: fn(&Reading) -> f64| rates(of).last().copied();
    let steps = |r: &Reading| r.steps;
    let events = |r: &Reading| r.events;
    view! {
        <Show when=move || available.get()>
            <figure class="chart server" data-test="server-chart">
                <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label="Server throughput">
                    <polyline class="steps" points=move || line(rates(steps)) />
                    <polyline class="events" points=move || line(rates(events)) />
                </svg>
                <figcaption>
                    <span class="key steps">"steps/s"</span>
                    <span class="key events">"events/s"</span>
                    <span data-test="server-rates">
                        {move || match (latest(steps), latest(events)) {
                            (Some(steps), Some(events)) => format!(" now: {steps:.1} steps/s, {events:.1} events/s"),
                            // One reading so far: a rate needs two.
                            _ => " measuring…".to_owned(),
                        }}
                    </span>
                </figcaption>
            </figure>
        </Show>
    }
}
