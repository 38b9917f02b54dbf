// Package readapi serves projections' rows over HTTP: a row by its
// aggregate key, and lists of rows in key order filtered by the columns a
// projection declares filterable, each row's columns mapped to JSON as
// docs/api.md describes. Every request is authenticated (auth), scoped to
// read:<projection>, and limited to its principal's tenant where the
// projection declares a tenant column.
//
// It must not write to the database, nor read any table but the
// projections' own (staleness and read-your-writes waits come from
// implementations of Staleness and Waiter), nor build SQL from anything
// but the projection file's identifiers, quoted: every value a request
// carries is a bound parameter.
package readapi
