//! How errors of the C++ entry points in `csrc/` reach Rust: a status, and on failure a message
//! malloc'd by the C++ side (`csrc/messages.h`), which is read and freed here, once.
//!
//! Every C++ exception is caught at the `extern "C"` boundary by `csrc/messages.h`'s `guarded`.

use std::ffi::{CStr, c_char, c_int};

use crate::error::{ModelError, Result};

unsafe extern "C" {
    fn rlvr_free_message(message: *mut c_char);
}

/// Takes a message written by the C++ side and frees it.
pub(crate) fn take_message(message: *mut c_char) -> String {
    if message.is_null() {
        return "unknown error".to_owned();
    }
    // SAFETY: a NUL-terminated string malloc'd by the C++ side, freed once, here.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy().into_owned();
    unsafe { rlvr_free_message(message) };
    text
}

/// Turns an entry point's status (0: done) and message into a result; frees the message.
pub(crate) fn checked(what: &str, status: c_int, message: *mut c_char) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    Err(ModelError::Torch { what: what.to_owned(), source: tch::TchError::Torch(take_message(message)) })
}
