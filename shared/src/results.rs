//! The results of the built-in task kinds (`result_data` of a completed task), typed so the CLI
//! and the dashboard can read them without guessing at JSON.

use serde::{Deserialize, Serialize};

/// Result of `start_data_migration`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationResult {
    pub migrated_records: u64,
    pub total_records: u64,
    pub source_path: String,
    pub destination_path: String,
    /// Size of the destination file in bytes.
    pub destination_bytes: u64,
    /// SHA-256 of the destination file, hex.
    pub destination_sha256: String,
    pub success: bool,
}

/// Result of `start_batch_processing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResult {
    pub processed: u64,
    pub total: u64,
    pub batch_size: u64,
    pub batches: u64,
    pub processing_delay: f64,
    /// SHA-256 chain over every processed item, hex: equal for equal inputs, however often the
    /// task was interrupted.
    pub digest: String,
    /// Sum of the processed item values.
    pub checksum: u64,
    pub success: bool,
}

/// Loss and accuracy after one training epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: u64,
    pub loss: f64,
    pub accuracy: f64,
}

impl EpochMetrics {
    /// The progress message of this epoch's step ("Epoch 3/100 - Loss: 0.6123, Accuracy:
    /// 0.7100"), which [`EpochMetrics::from_progress_message`] reads back (to four decimals):
    /// clients plot a running training from its messages.
    pub fn progress_message(&self, epochs: u64) -> String {
        format!(
            "Epoch {}/{epochs} - Loss: {:.4}, Accuracy: {:.4}",
            self.epoch, self.loss, self.accuracy
        )
    }

    /// The metrics in a message written by [`EpochMetrics::progress_message`].
    pub fn from_progress_message(message: &str) -> Option<EpochMetrics> {
        let (epoch, rest) = message.strip_prefix("Epoch ")?.split_once('/')?;
        let (_, metrics) = rest.split_once(" - Loss: ")?;
        let (loss, accuracy) = metrics.split_once(", Accuracy: ")?;
        Some(EpochMetrics {
            epoch: epoch.parse().ok()?,
            loss: loss.trim().parse().ok()?,
            accuracy: accuracy.trim().parse().ok()?,
        })
    }
}

/// Result of `start_ml_training`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingResult {
    pub model_name: String,
    pub dataset_size: u64,
    pub epochs_completed: u64,
    pub final_loss: f64,
    pub final_accuracy: f64,
    /// The learned weights, bias last.
    pub weights: Vec<f64>,
    /// One entry per epoch, in order.
    pub history: Vec<EpochMetrics>,
    pub success: bool,
}

/// One record produced by `resumable_data_processing`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessedRecord {
    pub record_id: String,
    pub processed_at: String,
    pub value: u64,
}

/// Result of `resumable_data_processing`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessingResult {
    pub dataset_name: String,
    pub total_processed: u64,
    /// The first five records.
    pub records: Vec<ProcessedRecord>,
    /// Sum of all record values: equal for equal inputs, however often the task was interrupted.
    pub value_sum: u64,
    pub status: String,
}

/// Result of `start_trip_planning`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TripResult {
    pub destination: String,
    pub start_date: String,
    pub nights: u32,
    /// The hotel chosen; `None` when the choice was declined.
    pub hotel: Option<String>,
    /// What the stay costs, in euros.
    pub total_cost: u64,
    pub booked: bool,
    /// The booking's reference, once booked: derived from the trip and the hotel, so it is
    /// the same however often the task was interrupted.
    pub booking_reference: Option<String>,
    /// How many answers the task applied: 2 for a booking, whatever was sent or repeated.
    pub answers_applied: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_messages_read_back() {
        let metrics = EpochMetrics {
            epoch: 3,
            loss: 0.612_345,
            accuracy: 0.71,
        };
        let message = metrics.progress_message(100);
        assert_eq!(message, "Epoch 3/100 - Loss: 0.6123, Accuracy: 0.7100");
        let read = EpochMetrics::from_progress_message(&message).unwrap();
        assert_eq!(read.epoch, 3);
        assert!((read.loss - metrics.loss).abs() < 1e-4);
        assert!((read.accuracy - metrics.accuracy).abs() < 1e-4);
        assert_eq!(
            EpochMetrics::from_progress_message("Processed 3/10 items"),
            None
        );
    }
}
