// Package adminapi serves the admin API under /admin/v1/: dead letters
// (list, show, redrive, purge), rebuild operations and offset resets,
// for principals with the admin scope. Every action is audited with the
// authenticated subject in the transaction of its effect.
package adminapi
