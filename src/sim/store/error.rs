//! Errors shaped like an API server `Status`.

use serde_json::{json, Value};

use super::super::ResourceDef;

/// An error shaped like an API server `Status`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub(super) fn not_found(def: &ResourceDef, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", def.resource_group()),
        );
        e.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
        e
    }
    pub(super) fn conflict(def: &ResourceDef, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                def.resource_group()
            ),
        );
        e.details = Some(json!({"name": name, "group": def.group, "kind": def.plural}));
        e
    }
    pub(super) fn invalid(def: &ResourceDef, name: &str, message: &str) -> Self {
        let mut e = Self::new(422, "Invalid", format!("{} \"{name}\" is invalid: {message}", def.kind));
        e.details = Some(json!({"name": name, "group": def.group, "kind": def.kind}));
        e
    }
}
