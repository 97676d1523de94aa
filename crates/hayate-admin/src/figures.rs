//! What a front-end publishes on the admin side: named figures (gauges and counters) read
//! when they are shown, in `/metrics` and in the front-end's section of `/api/overview` (and
//! so `/api/dashboard`). The admin side knows no front-end: whoever wires the server (it
//! knows both sides) hands [`AdminState`](super::AdminState) each front-end's figures.

use std::sync::Arc;

use serde_json::{Map, Value};

/// How a figure is exported to Prometheus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FigureKind {
    /// A value now.
    Gauge,
    /// A count that only grows (its sample is `NAME_total`).
    Counter,
}

/// One figure: its reading, where it is shown, and how.
#[derive(Clone)]
pub struct Figure {
    section: &'static str,
    kind: FigureKind,
    field: Option<&'static str>,
    metric: Option<(&'static str, &'static str)>,
    read: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl Figure {
    /// A gauge of front-end `section` (`mqtt`, `shm`), read by `read` at each scrape.
    pub fn gauge(section: &'static str, read: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self::new(section, FigureKind::Gauge, read)
    }

    /// A counter of front-end `section`, read by `read` at each scrape.
    pub fn counter(section: &'static str, read: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self::new(section, FigureKind::Counter, read)
    }

    fn new(
        section: &'static str,
        kind: FigureKind,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Self {
        Figure {
            section,
            kind,
            field: None,
            metric: None,
            read: Arc::new(read),
        }
    }

    /// Shown as `field` of its section in `/api/overview` and `/api/dashboard`.
    pub fn field(mut self, field: &'static str) -> Self {
        self.field = Some(field);
        self
    }

    /// Exported in `/metrics` as the family `name` (a counter's sample adds `_total`), with
    /// `help`.
    pub fn metric(mut self, name: &'static str, help: &'static str) -> Self {
        self.metric = Some((name, help));
        self
    }

    /// Its value now.
    pub fn value(&self) -> u64 {
        (self.read)()
    }

    /// How it is exported.
    pub fn kind(&self) -> FigureKind {
        self.kind
    }

    /// Its Prometheus family's name and help, when it has one.
    pub fn family(&self) -> Option<(&'static str, &'static str)> {
        self.metric
    }
}

impl std::fmt::Debug for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Figure")
            .field("section", &self.section)
            .field("kind", &self.kind)
            .field("field", &self.field)
            .field("metric", &self.metric.map(|m| m.0))
            .finish_non_exhaustive()
    }
}

/// Every front-end's figures; `/metrics` lists their families in this order.
#[derive(Clone, Debug, Default)]
pub struct Figures(Vec<Figure>);

impl Figures {
    /// No figures.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `figure` after those already there.
    pub fn push(&mut self, figure: Figure) -> &mut Self {
        self.0.push(figure);
        self
    }

    /// The figures, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Figure> {
        self.0.iter()
    }

    /// The overview's front-end sections, read now: `{section: {field: value}}` for the
    /// figures that have a field (a section without any is left out).
    pub fn sections(&self) -> Map<String, Value> {
        let mut out = Map::new();
        for f in &self.0 {
            let Some(field) = f.field else { continue };
            let section = out
                .entry(f.section)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = section {
                m.insert(field.to_string(), Value::from(f.value()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_hold_only_figures_with_a_field() {
        let mut f = Figures::new();
        f.push(
            Figure::gauge("mqtt", || 3)
                .field("connected")
                .metric("m", "h"),
        )
        .push(Figure::counter("mqtt", || 7).field("connections"))
        .push(Figure::gauge("shm", || 1).metric("s", "h"));
        let s = Value::Object(f.sections());
        assert_eq!(
            s,
            serde_json::json!({ "mqtt": { "connected": 3, "connections": 7 } })
        );
        let families: Vec<_> = f.iter().filter_map(|f| f.family()).collect();
        assert_eq!(families, [("m", "h"), ("s", "h")]);
    }
}
