//! Unit and property tests of the FS proxy machine.

use super::*;
