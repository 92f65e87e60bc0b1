//! `qoslet validate [--previous DIR] [--feature-gates G=true,...] PATH...`: checks Pods, Workloads,
//! PodGroups, CompositePodGroups and configuration files (docs/usage.md). Exit 0 when valid, 1 with
//! one line per problem (`file:line: Kind/namespace/name: rule: message`, sorted), 2 on unreadable
//! input or a malformed flag. A reference to an object not in the set (a forward reference) is
//! no problem: the API server takes it and the scheduler holds the object until the target
//! exists, so it is one `pending: ` line. As `plan` does, everything said about the input goes
//! to stderr; the verdict alone (`valid: N objects` or `invalid: N problems`) goes to stdout, so
//! a script can read it while a person reads the lines.

use std::{collections::BTreeMap, path::PathBuf, process::ExitCode};

use crate::{
    config::{ConfigError, KubeletConfig, QosletConfiguration},
    source::{
        admit::{Admitted, UnknownFields, admit, unique_uids},
        fields::shown,
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
pub(crate) struct ValidateArgs {
    /// Objects the change set replaces (matched by kind, namespace and name); immutable fields
    /// are checked against them and the merged set is validated.
    #[arg(long, value_name = "DIR")]
    pub(crate) previous: Option<PathBuf>,
    /// Feature gates, e.g. `PodGroupPreemptionPolicy=true` (until the config parser provides them).
    #[arg(long, value_name = "GATES", value_delimiter = ',')]
    pub(crate) feature_gates: Vec<String>,
    /// The largest file read, in bytes. FIFOs and devices are refused.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub(crate) max_manifest_bytes: u64,
    /// Files or directories of YAML (multi-document allowed).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
}

pub(crate) fn run(args: ValidateArgs) -> ExitCode {
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
    let objects = current.objects.len() + current.malformed.len();
    let checked = check(current, previous, &opts);
    for l in &checked.warnings {
        eprintln!("warning: {l}");
    }
    for l in &checked.pending {
        eprintln!("pending: {l}");
    }
    for l in &checked.problems {
        eprintln!("{l}");
    }
    println!("{}", checked.verdict(objects));
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
    pub(crate) pending: Vec<String>,
    /// Unknown fields of Pods and the scheduling kinds (`unknown-field`), dropped as the API
    /// server drops them: at most [`MAX_WARNINGS_PER_FILE`] a file, then one `and N more` line.
    pub(crate) warnings: Vec<String>,
    /// How many unknown fields there are, those past the lines' bound too.
    pub(crate) warning_count: usize,
}

/// The most warnings printed for one file.
pub(crate) const MAX_WARNINGS_PER_FILE: usize = 20;

impl Checked {
    /// The one line on stdout: `valid: N objects` or `invalid: N problems`, with the pending
    /// references when there are any.
    pub(crate) fn verdict(&self, objects: usize) -> String {
        let mut line = if self.problems.is_empty() {
            format!("valid: {}", count(objects, "object"))
        } else {
            format!("invalid: {}", count(self.problems.len(), "problem"))
        };
        if !self.pending.is_empty() {
            line.push_str(&format!(", {} pending", self.pending.len()));
        }
        if self.warning_count > 0 {
            line.push_str(&format!(", {}", count(self.warning_count, "warning")));
        }
        line
    }
}

/// `1 object`, `2 objects`.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The problem and pending lines of a change set (and the objects it replaces).
pub fn check(mut current: Loaded, previous: Option<Loaded>, opts: &ValidationOptions) -> Checked {
    let mut problems: Vec<Problem> = Vec::new();
    let mut pending: Vec<Problem> = Vec::new();
    let UnknownFields {
        found: mut warnings,
        more: unshown,
    } = UnknownFields::of(&current.objects);
    let mut texts = std::mem::take(&mut current.texts);
    let decode_all = |loaded: Loaded, problems: &mut Vec<Problem>| -> Vec<Object> {
        for m in loaded.malformed {
            let origin = Origin {
                file: m.file,
                index: m.index,
            };
            let mut p = Problem::new(
                &origin,
                format!("document {}", m.index),
                Rule::Schema,
                m.message,
            );
            p.field = m.field;
            problems.push(p);
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
        Some(mut prev) => {
            texts.append(&mut prev.texts);
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
    {
        let mut all: Vec<&mut Problem> = problems
            .iter_mut()
            .chain(pending.iter_mut())
            .chain(warnings.iter_mut())
            .collect();
        Loaded::locate(&texts, &mut all);
    }
    let sorted = |mut v: Vec<Problem>| {
        v.sort();
        v.dedup();
        v
    };
    let lines = |v: Vec<Problem>| sorted(v).iter().map(Problem::to_string).collect();
    let warning_count = warnings.len() + unshown.values().sum::<usize>();
    Checked {
        problems: lines(problems),
        pending: lines(pending),
        warnings: capped(sorted(warnings), unshown),
        warning_count,
    }
}

/// The warning lines, at most [`MAX_WARNINGS_PER_FILE`] a file, then `file: and N more
/// unknown fields` with those not shown (`unshown`: those not even noted, per file).
fn capped(warnings: Vec<Problem>, mut unshown: BTreeMap<PathBuf, usize>) -> Vec<String> {
    let mut lines = Vec::new();
    let mut shown_in: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for w in warnings {
        let n = shown_in.entry(w.origin.file.clone()).or_default();
        if *n < MAX_WARNINGS_PER_FILE {
            *n += 1;
            lines.push(w.to_string());
        } else {
            *unshown.entry(w.origin.file.clone()).or_default() += 1;
        }
    }
    for (file, n) in unshown {
        lines.push(UnknownFields::more_line(&file, n));
    }
    lines
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
/// each problem names the field and the value that is wrong; every problem of a
/// QosletConfiguration is reported, unknown fields among them (`unknown-field`: qoslet refuses
/// them in its own file).
fn validate_config_object(obj: &RawObject) -> Vec<Problem> {
    let errors = match obj.kind.as_str() {
        "KubeletConfiguration" => match serde_yaml_ng::to_string(&obj.value) {
            Ok(text) => KubeletConfig::parse(&obj.file, &text)
                .and_then(|kc| {
                    if let Some(note) = kc.ignored_note() {
                        eprintln!("note: {}: {note}", obj.file.display());
                    }
                    kc.check(&obj.file)
                })
                .err()
                .map(ConfigError::into_list)
                .unwrap_or_default(),
            Err(e) => return vec![raw_problem(obj, Rule::Schema, e.to_string())],
        },
        _ => QosletConfiguration::problems(&obj.file, obj.value.clone()),
    };
    errors
        .into_iter()
        .map(|e| match e {
            ConfigError::Invalid { field, message, .. } => {
                let rule = if field == "apiVersion" {
                    Rule::ApiVersion
                } else {
                    Rule::Schema
                };
                field_problem(obj, rule, field, message)
            }
            ConfigError::UnknownField { field, message, .. } => {
                field_problem(obj, Rule::UnknownField, field, message)
            }
            e => raw_problem(obj, Rule::Schema, e.to_string()),
        })
        .collect()
}

/// A problem of one field (`field: message`; the message alone for the whole document).
fn field_problem(obj: &RawObject, rule: Rule, field: String, message: String) -> Problem {
    let mut p = if field.is_empty() {
        raw_problem(obj, rule, message)
    } else {
        raw_problem(obj, rule, format!("{}: {message}", shown(&field)))
    };
    p.field = field;
    p
}
