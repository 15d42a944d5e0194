//! [`AckLogs`]: what each relay process printed before it was killed.

use std::path::Path;

use crate::Error;

/// The ack lines of each relay process, in start order (`life` 0, 1, 2...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckLogs {
    /// Per process: `(message id, JetStream said duplicate)`.
    pub lives: Vec<Vec<(String, bool)>>,
}

impl AckLogs {
    /// Reads every `*.acks` file of `dir`, ordered by the number in its name (`life-12.acks`).
    /// A line cut short by the kill is skipped.
    pub fn read(dir: &Path) -> Result<Self, Error> {
        let file_error = |source| Error::File {
            path: dir.to_owned(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(file_error)? {
            let path = entry.map_err(file_error)?.path();
            if path.extension().is_some_and(|e| e == "acks") {
                let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
                let number: u64 = name
                    .unwrap_or_default()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap_or(u64::MAX);
                files.push((number, path));
            }
        }
        files.sort();
        let mut lives = Vec::with_capacity(files.len());
        for (_, path) in files {
            let text = std::fs::read_to_string(&path).map_err(|source| Error::File {
                path: path.clone(),
                source,
            })?;
            let acks = text
                .lines()
                .filter_map(|line| match line.split_once(' ') {
                    Some((id, "0")) if id.len() == 36 => Some((id.to_owned(), false)),
                    Some((id, "1")) if id.len() == 36 => Some((id.to_owned(), true)),
                    _ => None,
                })
                .collect();
            lives.push(acks);
        }
        Ok(Self { lives })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_logs_are_read_in_process_order_and_torn_lines_skipped() {
        let dir = std::env::temp_dir().join(format!("acks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let id = "0190a8e2-7b3c-7def-8000-000000000001";
        std::fs::write(dir.join("life-10.acks"), format!("{id} 1\n")).unwrap();
        std::fs::write(dir.join("life-2.acks"), format!("{id} 0\n0190a8e2-7b3c")).unwrap();
        std::fs::write(dir.join("other.log"), "ignored").unwrap();
        let logs = AckLogs::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            logs.lives,
            vec![vec![(id.to_owned(), false)], vec![(id.to_owned(), true)]]
        );
    }
}
