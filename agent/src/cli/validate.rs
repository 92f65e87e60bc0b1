//! `qoslet validate [--previous DIR] [--feature-gates G=true,...] PATH...`: checks Pods, Workloads,
//! PodGroups, CompositePodGroups and configuration files (docs/usage.md). Exit 0 when valid, 1 with
//! one line per problem (`file: Kind/namespace/name: rule: message`, sorted), 2 on unreadable
//! input or a malformed flag. A reference to an object not in the set (a forward reference) is
//! no problem: the API server takes it and the scheduler holds the object until the target
//! exists, so it is one `pending: ` line on stderr.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode};

use crate::{
    config::{ConfigError, KubeletConfig, QosletConfiguration},
    source::{
        admit::{Admitted, admit, unique_uids},
        file::DEFAULT_MAX_BYTES,
        manifest::{Loaded, RawObject, load_paths},
    },
    workload::{
        Forest, Object, ValidationOptions, apply_updates, dangling,
        problem::{Problem, Rule},
        types::Origin,
        validate as validate_forest,
    },
};

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Objects the change set replaces (matched by kind, namespace and name); immutable fields
    /// are checked against them and the merged set is validated.
    #[arg(long, value_name = "DIR")]
    pub previous: Option<PathBuf>,
    /// Feature gates, e.g. `PodGroupPreemptionPolicy=true` (until the config parser provides them).
    #[arg(long, value_name = "GATES", value_delimiter = ',')]
    pub feature_gates: Vec<String>,
    /// The largest file read, in bytes. FIFOs and devices are refused.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub max_manifest_bytes: u64,
    /// Files or directories of YAML (multi-document allowed).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(args: ValidateArgs) -> ExitCode {
    let opts = match options(&args.feature_gates) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("qoslet validate: --feature-gates: {e}");
            return ExitCode::from(crate::exit::UNREADABLE);
        }
    };
    let load = |paths: &[PathBuf]| {
        load_paths(paths, args.max_manifest_bytes).map_err(|e| {
            let cause = e.source.to_string();
            eprintln!("qoslet validate: {e}: {cause}");
            ExitCode::from(crate::exit::UNREADABLE)
        })
    };
    let current = match load(&args.paths) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let previous = match &args.previous {
        Some(dir) => match load(std::slice::from_ref(dir)) {
            Ok(l) => Some(l),
            Err(code) => return code,
        },
        None => None,
    };
    let checked = check(current, previous, &opts);
    for l in &checked.pending {
        eprintln!("pending: {l}");
    }
    for l in &checked.problems {
        println!("{l}");
    }
    if checked.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::PROBLEMS)
    }
}

/// Reads `--feature-gates` entries (`Name=true|false`); gates qoslet does not use are ignored.
pub fn options(gates: &[String]) -> Result<ValidationOptions, String> {
    let mut opts = ValidationOptions::default();
    for g in gates.iter().map(|g| g.trim()).filter(|g| !g.is_empty()) {
        let (name, value) = g
            .split_once('=')
            .ok_or_else(|| format!("{g:?} is not Name=true|false"))?;
        let on = match value.trim() {
            "true" => true,
            "false" => false,
            v => return Err(format!("{name}: {v:?} is neither true nor false")),
        };
        if name.trim() == "PodGroupPreemptionPolicy" {
            opts.pod_group_preemption_policy = on;
        }
    }
    Ok(opts)
}

/// What `validate` reports of a change set, each list sorted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// The problem lines: the set is invalid when there is one.
    pub problems: Vec<String>,
    /// Forward references (`reference-exists`): held by the scheduler, not refused.
    pub pending: Vec<String>,
}

/// The problem and pending lines of a change set (and the objects it replaces).
pub fn check(current: Loaded, previous: Option<Loaded>, opts: &ValidationOptions) -> Checked {
    let mut problems: Vec<Problem> = Vec::new();
    let mut pending: Vec<Problem> = Vec::new();
    let decode_all = |loaded: Loaded, problems: &mut Vec<Problem>| -> Vec<Object> {
        for m in loaded.malformed {
            let origin = Origin {
                file: m.file,
                index: m.index,
            };
            problems.push(Problem::new(
                &origin,
                format!("document {}", m.index),
                Rule::Schema,
                m.message,
            ));
        }
        let mut admitted = Vec::new();
        for raw in &loaded.objects {
            match classify(raw) {
                Ok(Some(a)) => admitted.push(a),
                Ok(None) => {}
                Err(p) => problems.extend(p),
            }
        }
        problems.extend(unique_uids(&mut admitted, &BTreeMap::new()));
        admitted.into_iter().map(|a| a.object).collect()
    };
    let new = decode_all(current, &mut problems);
    let objects = match previous {
        Some(prev) => {
            let old = decode_all(prev, &mut problems);
            let applied = apply_updates(old, new);
            problems.extend(applied.rejected.into_iter().map(|r| r.problem));
            applied.objects
        }
        None => new,
    };
    for forest in Forest::by_namespace(objects).values() {
        problems.extend(validate_forest(forest, opts));
        pending.extend(dangling(forest));
    }
    let lines = |mut v: Vec<Problem>| {
        v.sort();
        v.dedup();
        v.iter().map(Problem::to_string).collect()
    };
    Checked {
        problems: lines(problems),
        pending: lines(pending),
    }
}

/// An admitted object (what `plan` and `run` accept), nothing (a valid configuration file), or
/// its problems.
fn classify(raw: &RawObject) -> Result<Option<Admitted>, Vec<Problem>> {
    if matches!(
        raw.kind.as_str(),
        "KubeletConfiguration" | "QosletConfiguration"
    ) {
        let p = validate_config_object(raw);
        return if p.is_empty() { Ok(None) } else { Err(p) };
    }
    admit(raw).map(Some)
}

fn raw_problem(raw: &RawObject, rule: Rule, message: String) -> Problem {
    let origin = Origin {
        file: raw.file.clone(),
        index: raw.index,
    };
    Problem::new(&origin, raw.display_id().to_string(), rule, message)
}

/// Configuration documents, checked by the same parser `plan` and `run` use (crate::config):
/// the line names the field and the value that is wrong.
fn validate_config_object(obj: &RawObject) -> Vec<Problem> {
    let text = match serde_yaml_ng::to_string(&obj.value) {
        Ok(t) => t,
        Err(e) => return vec![raw_problem(obj, Rule::Schema, e.to_string())],
    };
    let result = match obj.kind.as_str() {
        "KubeletConfiguration" => KubeletConfig::parse(&obj.file, &text).and_then(|kc| {
            if let Some(note) = kc.ignored_note() {
                eprintln!("note: {}: {note}", obj.file.display());
            }
            kc.check(&obj.file)
        }),
        _ => QosletConfiguration::parse(&obj.file, &text).and_then(|qc| qc.check(&obj.file)),
    };
    match result {
        Ok(()) => Vec::new(),
        Err(ConfigError::Invalid { field, message, .. }) => {
            let rule = if field == "apiVersion" {
                Rule::ApiVersion
            } else {
                Rule::Schema
            };
            let field = if field.is_empty() {
                String::new()
            } else {
                format!("{field}: ")
            };
            vec![raw_problem(obj, rule, format!("{field}{message}"))]
        }
        Err(e) => vec![raw_problem(obj, Rule::Schema, e.to_string())],
    }
}
