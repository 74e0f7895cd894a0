//! Fixture: a real shared library that exports a C function and no rlvr root module.

/// Something for the library to export.
#[unsafe(no_mangle)]
pub extern "C" fn rlvr_fixture_answer() -> u32 {
    42
}
