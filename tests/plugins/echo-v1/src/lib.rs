//! Fixture: version 1.0.0 of the `echo` verifier; it scores every item 1.0 so a test can tell
//! which version answered.

rlvr_plugin_api::export_verifier!(rlvr_fixture_support::Echo<1>);
