//! The command-line client's persistent state: its client id, kept under the XDG state
//! directory so that every run (and every session) owns the same tasks.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientState {
    pub client_id: String,
}

/// `$XDG_STATE_HOME/durable-mcp/client.json`, else `~/.local/state/durable-mcp/client.json`.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("durable-mcp").join("client.json")
}

impl ClientState {
    /// Loads the state at `path`, creating it on first use. A corrupt or foreign file is
    /// reported on stderr and replaced, never fatal.
    pub fn load_or_create(path: &Path) -> ClientState {
        match std::fs::read_to_string(path) {
            Ok(text) => match serde_json::from_str::<ClientState>(&text) {
                Ok(state) if !state.client_id.trim().is_empty() => return state,
                Ok(_) => eprintln!(
                    "warning: {} has an empty client id; starting a fresh one",
                    path.display()
                ),
                Err(e) => eprintln!(
                    "warning: {} is not a durable-mcp client state file ({e}); starting a fresh one",
                    path.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "warning: cannot read {} ({e}); starting a fresh one",
                path.display()
            ),
        }
        let state = ClientState {
            client_id: format!("cli-{}", uuid::Uuid::new_v4()),
        };
        if let Err(e) = state.save(path) {
            eprintln!(
                "warning: cannot save {} ({e}); this run's client id will not be kept",
                path.display()
            );
        }
        state
    }

    fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Write then rename, so an interrupted run never leaves half a file.
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, serde_json::to_vec_pretty(self)?)?;
        std::fs::rename(temporary, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_id_is_kept_and_a_corrupt_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/client.json");
        let first = ClientState::load_or_create(&path);
        assert!(first.client_id.starts_with("cli-"));
        assert_eq!(ClientState::load_or_create(&path), first);
        std::fs::write(&path, "{not json").unwrap();
        let fresh = ClientState::load_or_create(&path);
        assert_ne!(fresh, first);
        assert_eq!(ClientState::load_or_create(&path), fresh);
    }
}
