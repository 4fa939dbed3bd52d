//! Entry points shared by the fuzz targets in `fuzz/` and the tests that
//! replay their corpora, so both exercise exactly the same code.
