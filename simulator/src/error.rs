//! Errors from loading the simulator's input data.
//!
//! Every input is a file a user may have edited by hand, so each error names the file and,
//! where there is one, the line and column, so the fix is one editor jump away.

use std::path::PathBuf;

/// A data file could not be read or did not have the expected shape.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The CSV/TSV reader failed (bad quoting, invalid UTF-8, ...).
    #[error("{file}: line {line}: {source}")]
    Csv {
        /// The file, as given.
        file: String,
        /// 1-based line number, 0 when unknown.
        line: u64,
        /// The underlying error.
        #[source]
        source: csv::Error,
    },
    /// One cell held a value that could not be used.
    #[error("{file}: line {line}, column {column} ({name}): {message}")]
    Field {
        /// The file, as given.
        file: String,
        /// 1-based line number.
        line: u64,
        /// 1-based column number.
        column: usize,
        /// The column's header, or a description.
        name: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// The file as a whole is unusable (missing columns, no rows, ...).
    #[error("{file}: {message}")]
    Invalid {
        /// The file, as given.
        file: String,
        /// What is wrong.
        message: String,
    },
}

impl DataError {
    /// Builds a [`DataError::Csv`] from a reader error, taking the line from its position.
    pub(crate) fn csv(file: &str, source: csv::Error) -> Self {
        let line = source.position().map(|p| p.line()).unwrap_or(0);
        DataError::Csv {
            file: file.to_owned(),
            line,
            source,
        }
    }

    /// Builds a [`DataError::Invalid`].
    pub(crate) fn invalid(file: &str, message: impl Into<String>) -> Self {
        DataError::Invalid {
            file: file.to_owned(),
            message: message.into(),
        }
    }
}

/// Where a cell sits, for building [`DataError::Field`] errors while parsing a record.
pub(crate) struct Cell<'a> {
    pub file: &'a str,
    pub line: u64,
    pub column: usize,
    pub name: &'a str,
}

/// Where a record sits, for naming its cells in errors.
pub(crate) struct Row<'a> {
    pub file: &'a str,
    pub line: u64,
}

impl<'a> Row<'a> {
    /// Each record of `rdr` with where it sits in `file`; a record the reader refuses is an error.
    pub fn records<'r, R: std::io::Read>(
        rdr: &'r mut csv::Reader<R>,
        file: &'a str,
    ) -> impl Iterator<Item = Result<(Row<'a>, csv::StringRecord), DataError>> + 'r
    where
        'a: 'r,
    {
        rdr.records().map(move |rec| {
            let rec = rec.map_err(|e| DataError::csv(file, e))?;
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            Ok((Row { file, line }, rec))
        })
    }

    /// The cell at zero-based `column`, called `name` in errors.
    pub fn cell(&self, column: usize, name: &'a str) -> Cell<'a> {
        Cell {
            file: self.file,
            line: self.line,
            column: column + 1,
            name,
        }
    }
}

impl Cell<'_> {
    /// An error about this cell.
    pub fn err(&self, message: impl Into<String>) -> DataError {
        DataError::Field {
            file: self.file.to_owned(),
            line: self.line,
            column: self.column,
            name: self.name.to_owned(),
            message: message.into(),
        }
    }

    /// Parses the cell as a finite, non-negative number.
    pub fn non_negative(&self, raw: &str) -> Result<f64, DataError> {
        let v: f64 = raw
            .trim()
            .parse()
            .map_err(|_| self.err(format!("expected a number, found {raw:?}")))?;
        if !v.is_finite() || v < 0.0 {
            return Err(self.err(format!("expected a finite number >= 0, found {raw:?}")));
        }
        Ok(v)
    }

    /// Parses the cell as a positive integer.
    pub fn positive_int(&self, raw: &str) -> Result<u32, DataError> {
        let t = raw.trim();
        // Accept "4" and "4.0" (pandas writes integers as floats in some exports).
        let v = t
            .parse::<u32>()
            .ok()
            .or_else(|| {
                t.parse::<f64>()
                    .ok()
                    .filter(|f| f.fract() == 0.0 && *f >= 1.0 && *f <= f64::from(u32::MAX))
                    .map(|f| f as u32)
            })
            .filter(|v| *v >= 1)
            .ok_or_else(|| self.err(format!("expected a positive integer, found {raw:?}")))?;
        Ok(v)
    }
}
