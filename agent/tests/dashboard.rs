//! The monitoring that ships cannot drift from the code: every metric name in every PromQL
//! expression of the dashboard (deploy/grafana/qoslet.json) and the alert rules
//! (deploy/kubernetes/prometheusrule.yaml) is one the agent's registry exposes, or one
//! Prometheus makes itself for every scrape target (`up`); every metric docs/runbooks.md names
//! is registered; and the metrics table of docs/usage.md lists exactly the registry's metrics,
//! each with its type.

use std::{collections::BTreeSet, path::Path};

use qoslet::hub::metrics::Metrics;
use serde_json::Value;

/// Metric names in a PromQL expression: identifiers outside strings, label matchers, ranges
/// and grouping clauses that are neither function calls nor keywords.
fn metric_names(expr: &str) -> Vec<String> {
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    // Binary operators, modifiers and the aggregations (`sum by (x) (...)` puts a clause
    // between the name and its parenthesis).
    const KEYWORDS: [&str; 19] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    let c: Vec<char> = expr.chars().collect();
    let skip_to = |from: usize, close: char| {
        c[from + 1..]
            .iter()
            .position(|&x| x == close)
            .map_or(c.len(), |p| from + 1 + p + 1)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '"' | '\'' => i = skip_to(i, c[i]),
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '$' => {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
            x if x.is_ascii_digit() || x == '.' => {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            x if x.is_alphabetic() || x == '_' || x == ':' => {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                let ident: String = c[start..i].iter().collect();
                let mut j = i;
                while j < c.len() && c[j].is_whitespace() {
                    j += 1;
                }
                let call = j < c.len() && c[j] == '(';
                if GROUPING.contains(&ident.as_str()) {
                    // The label list, when there is one (`group_left` may stand alone).
                    if call {
                        i = skip_to(j, ')');
                    }
                } else if !call && !KEYWORDS.contains(&ident.as_str()) {
                    out.push(ident);
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// Grafana's `label_values(metric, label)` names a metric, then a label.
fn query_metrics(expr: &str) -> Vec<String> {
    match expr.strip_prefix("label_values(") {
        Some(args) => metric_names(args.split(',').next().unwrap_or_default()),
        None => metric_names(expr),
    }
}

fn expressions(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    // Panel targets and the query variable's definition.
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => expressions(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

#[test]
fn the_expression_parser_finds_metric_names_only() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (namespace, le) (rate(a_bucket{pod!="", x=~"$node"}[$__rate_interval]))) / on (pod) group_left b_total or vector(1e3)"#
        ),
        ["a_bucket", "b_total"]
    );
    assert_eq!(
        query_metrics("label_values(qoslet_node_allocatable, instance)"),
        ["qoslet_node_allocatable"]
    );
}

#[test]
fn every_dashboard_metric_is_registered_by_the_agent() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/qoslet.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    let metrics = Metrics::new();
    let mut exposed: BTreeSet<&str> = metrics.series_names().iter().map(String::as_str).collect();
    // Prometheus' own health series of each scrape (the "Agent up" panel).
    exposed.insert("up");
    assert!(exposed.contains("qoslet_memcg_events_total"), "{exposed:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = query_metrics(e);
        assert!(!names.is_empty(), "no metric in {e}");
        for n in names {
            assert!(
                exposed.contains(n.as_str()),
                "{n} (in {e}) is not registered"
            );
            used.insert(n);
        }
    }
    assert!(used.len() >= 10, "{used:?}");
}

/// The rows of docs/usage.md's metrics table: (name, type).
fn documented_metrics() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage.md");
    let text = std::fs::read_to_string(path).unwrap();
    let table = text
        .split_once("The metric names are a stable interface:")
        .expect("the metrics table's heading line")
        .1;
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

#[test]
fn the_usage_docs_list_every_metric_the_agent_registers() {
    let metrics = Metrics::new();
    let exposed: BTreeSet<&str> = metrics.series_names().iter().map(String::as_str).collect();
    let mut documented = BTreeSet::new();
    for (name, kind) in documented_metrics() {
        // The series a metric of each type carries, as the registry names them.
        let series: Vec<String> = match kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect(),
            "counter" => {
                assert!(name.ends_with("_total"), "counter {name} without _total");
                vec![name.clone()]
            }
            "gauge" => vec![name.clone()],
            other => panic!("{name}: unknown type {other}"),
        };
        for s in series {
            assert!(
                exposed.contains(s.as_str()),
                "docs/usage.md lists {name} ({kind}), the agent has no {s}"
            );
            documented.insert(s);
        }
    }
    let undocumented: Vec<&&str> = exposed
        .iter()
        .filter(|s| !documented.contains(**s))
        .collect();
    assert!(
        undocumented.is_empty(),
        "registered, not in docs/usage.md's metrics table: {undocumented:?}"
    );
}

/// The series the agent's registry exposes, and `up`.
fn exposed() -> BTreeSet<String> {
    let mut exposed: BTreeSet<String> = Metrics::new().series_names().iter().cloned().collect();
    exposed.insert("up".into());
    exposed
}

#[test]
fn every_alert_rule_metric_is_registered_by_the_agent() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/prometheusrule.yaml");
    let rule: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exposed = exposed();
    let mut rules = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let expr = r["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "no metric in {expr}");
            for n in names {
                assert!(exposed.contains(&n), "{n} (in {expr}) is not registered");
            }
            rules += 1;
        }
    }
    assert!(rules >= 10, "{rules} rules");
}

#[test]
fn every_metric_the_runbooks_name_is_registered_by_the_agent() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/runbooks.md");
    let text = std::fs::read_to_string(path).unwrap();
    let exposed = exposed();
    let mut named = 0;
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("qoslet_") || word.starts_with("process_") {
            // A histogram is named by its family, without the `_bucket` of its series.
            assert!(
                exposed.contains(word) || exposed.contains(&format!("{word}_bucket")),
                "docs/runbooks.md names {word}, which the agent does not register"
            );
            named += 1;
        }
    }
    assert!(named >= 10, "{named} metric names");
}
