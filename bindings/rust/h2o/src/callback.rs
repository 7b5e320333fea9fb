//! Rust closures behind C callbacks. A panic must not unwind into C: it is caught at the
//! boundary, the callback tells the library to stop, and the call that ran it then returns
//! Error::CallbackPanicked instead of its own result.
use crate::error::{Error, Result};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) struct Guarded<F> {
    pub(crate) f: F,
    panic: Option<String>,
}

impl<F> Guarded<F> {
    pub(crate) fn new(f: F) -> Self {
        Guarded { f, panic: None }
    }

    /// Runs `body` on the closure; after a panic (this time or before) returns `stop`.
    pub(crate) fn call<R>(&mut self, stop: R, body: impl FnOnce(&mut F) -> R) -> R {
        if self.panic.is_some() {
            return stop;
        }
        match catch_unwind(AssertUnwindSafe(|| body(&mut self.f))) {
            Ok(r) => r,
            Err(payload) => {
                self.panic = Some(panic_message(payload));
                stop
            }
        }
    }

    /// The message of a panic since the last take, if any; the closure runs again after it.
    pub(crate) fn take_panic(&mut self) -> Option<String> {
        self.panic.take()
    }

    /// The call's result, unless the closure panicked.
    pub(crate) fn finish<T>(self, result: Result<T>) -> Result<T> {
        match self.panic {
            Some(message) => Err(Error::CallbackPanicked { message }),
            None => result,
        }
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}
