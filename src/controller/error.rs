//! The errors a controller's [`run`](super::Controller::run) stream carries.

use kube::core::DynamicObject;
use kube::runtime::reflector::ObjectRef;

use crate::informer::InformerError;
use crate::store::StoreError;

/// An error item of [`Controller::run`](super::Controller::run)'s stream (kube-runtime's
/// `controller::Error`). None of them ends the stream except [`Informer`](Self::Informer),
/// after which nothing was reconciled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E: std::error::Error + 'static> {
    /// A reconcile was due for an object that is not in the cache (deleted, or an owner
    /// reference or mapper naming an object that does not exist). Usually harmless, as in
    /// kube-runtime.
    #[error("tried to reconcile object {0} that was not found in the cache")]
    ObjectNotFound(Box<ObjectRef<DynamicObject>>),
    /// The reconcile returned this error; the error policy then decided the next attempt.
    #[error("reconciler for object {1} failed: {0}")]
    ReconcilerFailed(#[source] E, Box<ObjectRef<DynamicObject>>),
    /// The reconcile panicked; it is retried through the rate limiter.
    #[error("reconciler for object {1} panicked: {0}")]
    ReconcilerPanicked(String, Box<ObjectRef<DynamicObject>>),
    /// The delete hook (see [`Controller::on_delete`](super::Controller::on_delete)) failed; it is
    /// retried through the rate limiter.
    #[error("delete hook for object {1} failed: {0}")]
    DeleteHookFailed(#[source] super::BoxError, Box<ObjectRef<DynamicObject>>),
    /// Reading the object from the cache failed; retried through the rate limiter.
    #[error("reading object {1} from the cache failed: {0}")]
    Store(#[source] StoreError, Box<ObjectRef<DynamicObject>>),
    /// An informer could not be built, or stopped before its cache synced: no reconcile ran,
    /// and the stream ends.
    #[error("informer: {0}")]
    Informer(#[source] InformerError),
    /// `owns` or `watches` was given an `Api` but the controller has no database to build its
    /// informer in (it was made by [`Controller::for_informer`](super::Controller::for_informer)):
    /// pass an informer instead (`owns_informer`, `watches_informer`). The stream ends.
    #[error("{0} needs a database: build the controller with Controller::new, or pass an informer")]
    NoDatabase(&'static str),
}
