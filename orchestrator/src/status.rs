//! `GET /status`: one read-only HTML page an operator would rather look at than read `/state`:
//! the cluster's accelerators by node and model, what Kudos learned (a heatmap of predicted
//! seconds per unit of work for each class on each GPU model, shaded by confidence), the latest
//! placements with their explanation, and the nodes Kudos avoids and why.
//!
//! Rendered on the server from the same index `/state` reads (no script, nothing fetched), so it
//! works through `kubectl port-forward` and in a headless browser alike. Every name in it comes
//! from users (classes, pods, nodes, models) and is HTML-escaped.

use std::collections::BTreeMap;
use std::fmt::Write;

use kudos_scheduler_core::{DeviceProfile, NodeHealth, PredictionSource, Scheduler};

use crate::extender::Explained;
use crate::index::StateView;

/// Heatmap rows (classes) shown at most; the rest are counted.
pub const MAX_CLASSES: usize = 60;
/// Heatmap columns (GPU models) shown at most.
pub const MAX_MODELS: usize = 40;

/// What one page shows.
pub struct StatusInputs<'a> {
    /// The index's view (nodes, heartbeats, monitor, model summary).
    pub view: &'a StateView,
    /// The published model, for predictions.
    pub model: &'a Scheduler,
    /// The latest rankings, newest first: (`namespace/pod`, ranking).
    pub recent: &'a [(String, std::sync::Arc<Explained>)],
    /// Unix seconds now.
    pub now: f64,
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What a prediction rests on, in words (the status page, events, `KudosClass`).
pub fn describe_source(s: &PredictionSource) -> String {
    match s {
        PredictionSource::OwnHistory { runs } => format!("{runs} runs on the node"),
        PredictionSource::Profile { runs } => format!("{runs} runs on this model"),
        PredictionSource::Transfer => "from other classes".into(),
        PredictionSource::Prior => "prior (device table)".into(),
    }
}

/// A cell's colour: hue from green (the row's fastest) to red (its slowest, or 10x slower),
/// lightness rising with uncertainty so a guess looks pale.
fn shade(seconds: f64, fastest: f64, log_sd: f64) -> String {
    let ratio = (seconds / fastest).max(1.0).ln() / 10f64.ln();
    let hue = 120.0 * (1.0 - ratio.min(1.0));
    let light = 45.0 + 40.0 * (log_sd / (1.0 + log_sd)).min(1.0);
    format!("hsl({hue:.0},70%,{light:.0}%)")
}

/// Nodes by GPU model.
fn models_of(v: &StateView) -> BTreeMap<&str, Vec<(&str, &DeviceProfile)>> {
    let mut models: BTreeMap<&str, Vec<(&str, &DeviceProfile)>> = BTreeMap::new();
    for n in &v.nodes {
        models
            .entry(n.profile.model.as_str())
            .or_default()
            .push((n.name.as_str(), &n.profile));
    }
    models
}

/// What Kudos learned of one class: its predicted seconds per unit of work on each GPU model
/// of the cluster, and how many runs it learned from.
pub struct ClassSpeeds {
    /// The class.
    pub class: String,
    /// Runs of the class on any node.
    pub runs: u64,
    /// (GPU model, prediction for one unit of work), in model order.
    pub cells: Vec<(String, kudos_scheduler_core::Prediction)>,
}

/// The learned speeds of the first `max_classes` classes on the first `max_models` GPU models.
/// Predictions are per device profile unless a node has its own history: each model is
/// represented by its node with the most runs of the class.
pub fn learned_speeds(
    v: &StateView,
    model: &Scheduler,
    max_classes: usize,
    max_models: usize,
) -> Vec<ClassSpeeds> {
    let models = models_of(v);
    let state = model.state();
    state
        .classes()
        .take(max_classes)
        .map(|class| {
            let cells = models
                .iter()
                .take(max_models)
                .filter_map(|(m, nodes)| {
                    let (node, profile) = nodes
                        .iter()
                        .max_by_key(|(node, _)| state.node_runs(class, node))
                        .copied()?;
                    Some((
                        (*m).to_owned(),
                        model.predict(class, node, profile, Some(1.0)),
                    ))
                })
                .collect();
            let runs = v
                .nodes
                .iter()
                .map(|n| u64::from(state.node_runs(class, &n.name)))
                .sum();
            ClassSpeeds {
                class: class.to_owned(),
                runs,
                cells,
            }
        })
        .collect()
}

/// The page.
pub fn render(inp: &StatusInputs<'_>) -> String {
    let v = inp.view;
    let mut h = String::with_capacity(16 * 1024);
    let _ = write!(
        h,
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Kudos status</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin:.5em 0 1.5em}}td,th{{border:1px solid #ccc;\
         padding:.25em .6em;text-align:left}}th{{background:#f3f3f3}}td.num{{text-align:right}}\
         .hm td{{text-align:center;min-width:6em}}.hm small{{display:block;color:#333}}\
         .bad{{color:#a00}}</style></head><body>"
    );
    let _ = write!(
        h,
        "<h1>Kudos status</h1><p>{} runs learned, {} classes, {} nodes with accelerators; \
         ready: {}. Details as JSON: <a href=\"/state\">/state</a>, per pod: \
         <code>/explain/&lt;namespace&gt;/&lt;pod&gt;</code>.</p>",
        v.model.runs,
        v.model.classes.len(),
        v.nodes.len(),
        v.ready
    );

    // Accelerators by model, then by node.
    let mut by_model: BTreeMap<(&str, &str), (usize, u32, u32)> = BTreeMap::new();
    for n in &v.nodes {
        let e = by_model
            .entry((n.profile.vendor.as_str(), n.profile.model.as_str()))
            .or_default();
        e.0 += 1;
        e.1 += n.profile.count;
        e.2 += n.free_devices;
    }
    h.push_str(
        "<h2>Accelerators</h2><table id=models><tr><th>vendor</th><th>model</th>\
         <th>nodes</th><th>devices</th><th>free</th></tr>",
    );
    for ((vendor, model), (nodes, devices, free)) in &by_model {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=num>{nodes}</td><td class=num>{devices}</td>\
             <td class=num>{free}</td></tr>",
            esc(vendor),
            esc(model)
        );
    }
    h.push_str(
        "</table><table id=nodes><tr><th>node</th><th>model</th><th>devices</th><th>free</th>\
         <th>health</th></tr>",
    );
    for n in &v.nodes {
        let health = match &n.health {
            NodeHealth::Healthy => "healthy".to_string(),
            other => format!("<span class=bad>{}</span>", esc(&format!("{other:?}"))),
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=num>{}</td><td class=num>{}</td><td>{health}</td></tr>",
            esc(&n.name),
            esc(&n.profile.model),
            n.profile.count,
            n.free_devices
        );
    }
    h.push_str("</table>");

    let learned = learned_speeds(v, inp.model, MAX_CLASSES, MAX_MODELS);
    let class_count = inp.model.state().classes().count();
    h.push_str(
        "<h2>Learned speed</h2><p>Predicted seconds per unit of work (<code>kudos.dev/work</code>) \
         of each class on each GPU model; green is the class's fastest, red ten times slower or \
         more, pale is uncertain (what the prediction rests on is under the number).</p>\
         <table class=hm id=heatmap><tr><th>class</th>",
    );
    for m in models_of(v).keys().take(MAX_MODELS) {
        let _ = write!(h, "<th>{}</th>", esc(m));
    }
    h.push_str("</tr>");
    for ClassSpeeds { class, cells, .. } in &learned {
        let fastest = cells
            .iter()
            .map(|(_, p)| p.seconds)
            .fold(f64::INFINITY, f64::min);
        let _ = write!(h, "<tr><th>{}</th>", esc(class));
        for (model, p) in cells {
            let _ = write!(
                h,
                "<td data-class=\"{}\" data-model=\"{}\" data-seconds=\"{:.4}\" style=\"background:{}\">\
                 {:.3}<small>×/÷ {:.2} · {}</small></td>",
                esc(class),
                esc(model),
                p.seconds,
                shade(p.seconds, fastest, p.uncertainty_log_sd),
                p.seconds,
                p.uncertainty_log_sd.exp(),
                esc(&describe_source(&p.source))
            );
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    if class_count > MAX_CLASSES {
        let _ = write!(
            h,
            "<p>{} more classes in <a href=\"/state\">/state</a>.</p>",
            class_count - MAX_CLASSES
        );
    }

    // Recent placements.
    h.push_str(
        "<h2>Recent placements</h2><table id=placements><tr><th>pod</th><th>class</th>\
         <th>ranked first</th><th>predicted s</th><th>review</th><th>candidates</th>\
         <th>seconds ago</th></tr>",
    );
    for (pod, e) in inp.recent {
        let r = &e.ranking;
        let first = r.entry(0);
        let first = first.as_ref();
        let _ = write!(
            h,
            "<tr><td><a href=\"/explain/{}\">{}</a></td><td>{}</td><td>{}</td><td class=num>{}</td>\
             <td>{}</td><td class=num>{}</td><td class=num>{:.0}</td></tr>",
            esc(pod),
            esc(pod),
            esc(r.class().unwrap_or("-")),
            esc(first.map_or("-", |f| f.node.as_str())),
            first
                .and_then(|f| f.prediction.as_ref())
                .map_or("-".into(), |p| format!("{:.2}", p.seconds)),
            first
                .and_then(|f| f.review)
                .map_or("-".into(), |r| format!("{r:?}")),
            r.len(),
            (inp.now - e.computed_at).max(0.0)
        );
    }
    h.push_str("</table>");

    // Nodes Kudos avoids.
    h.push_str("<h2>Nodes Kudos avoids</h2><table id=avoided><tr><th>node</th><th>why</th></tr>");
    let mut any = false;
    if let Some(mon) = &v.node_monitor {
        for m in mon.nodes.iter().filter(|m| m.exclude_from_ranking) {
            any = true;
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=bad>{}</td></tr>",
                esc(&m.node),
                esc(&format!("{:?}", m.reasons))
            );
        }
    }
    for n in v
        .nodes
        .iter()
        .filter(|n| !matches!(n.health, NodeHealth::Healthy))
    {
        any = true;
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=bad>{}</td></tr>",
            esc(&n.name),
            esc(&format!("{:?}", n.health))
        );
    }
    if !any {
        h.push_str("<tr><td colspan=2>none</td></tr>");
    }
    h.push_str("</table></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped() {
        assert_eq!(esc("<b a=\"x\">&'"), "&lt;b a=&quot;x&quot;&gt;&amp;&#39;");
    }

    #[test]
    fn shade_goes_green_to_red_and_pales_with_uncertainty() {
        assert_eq!(shade(1.0, 1.0, 0.0), "hsl(120,70%,45%)");
        assert_eq!(shade(10.0, 1.0, 0.0), "hsl(0,70%,45%)");
        assert_eq!(shade(100.0, 1.0, 0.0), "hsl(0,70%,45%)");
        assert!(shade(1.0, 1.0, 3.0).ends_with("75%)"));
    }
}
