// Package projection defines read models: which topic feeds which table,
// how an event becomes a row (snapshot or fold, declarative or a Go
// function), and the projection file format that declares them.
//
// It holds no connections and does no I/O beyond reading the projection
// file: sinks create and write the tables, partition workers feed the folds.
package projection
