//! Placeholder until the dashboard issue: the shared types already compile for wasm32.
