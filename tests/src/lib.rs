//! Helpers shared by the integration tests: artifacts, temp state dirs, daemons under test.
