//! The read-only gate: a read-only gateway serves reads and refuses every mutation.

use super::{Operation, StackState};
use crate::core::{CoreError, ErrorKind};

/// `read_only` when the gateway is read-only and `op` is a mutation.
pub fn check(state: &StackState, op: Operation) -> Result<(), CoreError> {
    if state.is_read_only() && !op.read_only {
        return Err(CoreError::new(
            ErrorKind::ReadOnly,
            format!("this gateway is read-only: {} is a mutation", op.id),
        ));
    }
    Ok(())
}
