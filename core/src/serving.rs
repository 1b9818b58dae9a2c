//! What a function asks of its runtime beyond its slice: the model it
//! serves and extra command-line arguments and environment variables
//! ([`FunctionSpec::model`], [`FunctionSpec::args`], [`FunctionSpec::env`]).
//!
//! ```text
//!   deploy body / function file ─▶ check_serving (here: shapes, lengths, charsets)
//!        │                          region API, config reader and the state machine's apply
//!        ▼
//!   agent: the runtime's template ─▶ allow_args / allow_env (which flags and names
//!        the operator lets a function set; docs/config.md) ─▶ argv, environment
//! ```
//!
//! The region checks only what it can know: the template (and so which
//! flags and variables a runtime accepts) is the agent operator's. Every
//! value is passed to the process as one argv element or one environment
//! value, never through a shell, and is not rendered as a template.

#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]

use crate::model::FunctionSpec;

/// Longest model id, bytes.
pub const MAX_MODEL_LEN: usize = 256;
/// Most extra arguments.
pub const MAX_ARGS: usize = 64;
/// Longest extra argument, bytes.
pub const MAX_ARG_LEN: usize = 1024;
/// Most extra environment variables.
pub const MAX_ENV: usize = 64;
/// Longest environment variable name, bytes.
pub const MAX_ENV_NAME_LEN: usize = 128;
/// Longest environment value, bytes.
pub const MAX_ENV_VALUE_LEN: usize = 4096;

/// A model id, argument or environment entry that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ServingError {
    /// The field as the API names it (`model`, `args[2]`, `env.HF_HOME`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> ServingError {
    ServingError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Whether `model` is a model id: 1 to [`MAX_MODEL_LEN`] bytes of
/// `/`-separated segments (`org/model`, `meta-llama/Llama-3.1-8B-Instruct`,
/// `tiny`), each of ASCII letters, digits, `.`, `_` and `-`, starting with
/// a letter, digit or `_` (so never `.`, `..` or a flag-like `-x`). Not an
/// absolute path: a function cannot point its runtime at the host's files.
pub fn check_model(model: &str) -> Result<(), ServingError> {
    let field = "model";
    if model.is_empty() || model.len() > MAX_MODEL_LEN {
        return Err(bad(
            field,
            format!(
                "must be 1 to {MAX_MODEL_LEN} bytes, got {} (write it as org/model)",
                model.len()
            ),
        ));
    }
    for segment in model.split('/') {
        let first_ok = segment
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok {
            return Err(bad(
                field,
                format!(
                    "{model:?}: every `/`-separated part must start with a letter, digit or `_` \
                     (no empty part, no leading `/`, `.` or `-`)"
                ),
            ));
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(bad(
                field,
                format!("{model:?}: {c:?} is not allowed (letters, digits, `.`, `_`, `-` and `/`)"),
            ));
        }
    }
    Ok(())
}

/// Whether `name` is an environment variable name: `[A-Za-z_][A-Za-z0-9_]*`,
/// at most [`MAX_ENV_NAME_LEN`] bytes.
pub fn is_env_name(name: &str) -> bool {
    name.len() <= MAX_ENV_NAME_LEN
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Argument `i` of `args`: 1 to [`MAX_ARG_LEN`] bytes, no control character.
pub fn check_arg(i: usize, a: &str) -> Result<(), ServingError> {
    if a.is_empty() || a.len() > MAX_ARG_LEN {
        return Err(bad(
            format!("args[{i}]"),
            format!("must be 1 to {MAX_ARG_LEN} bytes, got {}", a.len()),
        ));
    }
    if a.chars().any(char::is_control) {
        return Err(bad(format!("args[{i}]"), "holds a control character"));
    }
    Ok(())
}

/// Variable `name` of `env` with `value`: a name per [`is_env_name`], a
/// value of at most [`MAX_ENV_VALUE_LEN`] bytes without NUL.
pub fn check_env(name: &str, value: &str) -> Result<(), ServingError> {
    if !is_env_name(name) {
        return Err(bad(
            format!("env.{name}"),
            format!(
                "a variable name is a letter or `_`, then letters, digits or `_` \
                 (at most {MAX_ENV_NAME_LEN} bytes)"
            ),
        ));
    }
    if value.len() > MAX_ENV_VALUE_LEN || value.contains('\0') {
        return Err(bad(
            format!("env.{name}"),
            format!("a value is at most {MAX_ENV_VALUE_LEN} bytes without NUL"),
        ));
    }
    Ok(())
}

/// The checks of a spec's `model`, `args` and `env` (the first problem).
pub fn check_serving(spec: &FunctionSpec) -> Result<(), ServingError> {
    if let Some(model) = &spec.model {
        check_model(model)?;
    }
    if spec.args.len() > MAX_ARGS {
        return Err(bad(
            "args",
            format!("at most {MAX_ARGS} arguments, got {}", spec.args.len()),
        ));
    }
    for (i, a) in spec.args.iter().enumerate() {
        check_arg(i, a)?;
    }
    if spec.env.len() > MAX_ENV {
        return Err(bad(
            "env",
            format!("at most {MAX_ENV} variables, got {}", spec.env.len()),
        ));
    }
    for (k, v) in &spec.env {
        check_env(k, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_of_registries_pass_and_paths_and_flags_do_not() {
        for ok in [
            "org/model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "Qwen/Qwen2.5-0.5B-Instruct",
            "tiny",
            "_a/b.c_d-e",
        ] {
            assert_eq!(check_model(ok), Ok(()), "{ok}");
        }
        for (no, says) in [
            ("", "1 to 256 bytes"),
            ("/etc/passwd", "start with"),
            ("org/../x", "start with"),
            ("./m", "start with"),
            ("--trust-remote-code", "start with"),
            ("org//m", "start with"),
            ("org/m/", "start with"),
            ("org/m odel", "' ' is not allowed"),
            ("org/m{port}", "'{' is not allowed"),
            ("org/mé", "'é' is not allowed"),
        ] {
            let e = check_model(no).unwrap_err();
            assert_eq!(e.field, "model");
            assert!(e.reason.contains(says), "{no}: {e}");
        }
        assert!(check_model(&"a".repeat(MAX_MODEL_LEN)).is_ok());
        assert!(check_model(&"a".repeat(MAX_MODEL_LEN + 1)).is_err());
    }

    #[test]
    fn env_names_are_shell_names() {
        assert!(is_env_name("HF_HOME") && is_env_name("_x1"));
        assert!(!is_env_name("1X") && !is_env_name("A-B") && !is_env_name(""));
        assert!(!is_env_name("A=B"));
    }
}
