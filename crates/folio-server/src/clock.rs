//! [`unix_now`]: the wall clock as answers carry it (`created`).

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
