package outboxplugin

import (
	"fmt"
	"testing"
)

// What a statement does to its transaction, read as the databases read it: keywords in any case,
// after blanks and comments, with the optional words each dialect allows, and savepoint names
// compared as the database compares them.
func TestParseTxStatement(t *testing.T) {
	for _, c := range []struct {
		query string
		pg    bool
		want  txStatement
	}{
		{"SAVEPOINT sp1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"savepoint SP1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"  \n\tSavePoint Sp1;", true, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{`SAVEPOINT "Sp1"`, true, txStatement{kind: txSavepoint, savepoint: "Sp1"}},
		{`SAVEPOINT "Sp1"`, false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{`SAVEPOINT "a""b"`, true, txStatement{kind: txSavepoint, savepoint: `a"b`}},
		{"SAVEPOINT `Sp1`", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"SAVEPOINT sp$1_x", true, txStatement{kind: txSavepoint, savepoint: "sp$1_x"}},
		{"/* app */ SAVEPOINT sp1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"/* a */ /* b */SAVEPOINT/* c */sp1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"-- app\n-- more\nSAVEPOINT sp1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"# app\nSAVEPOINT sp1", false, txStatement{kind: txSavepoint, savepoint: "sp1"}},
		{"RELEASE SAVEPOINT sp1", false, txStatement{kind: txRelease, savepoint: "sp1"}},
		{"release sp1", true, txStatement{kind: txRelease, savepoint: "sp1"}},
		{"ROLLBACK TO SAVEPOINT sp1", false, txStatement{kind: txRollbackTo, savepoint: "sp1"}},
		{"rollback to sp1", true, txStatement{kind: txRollbackTo, savepoint: "sp1"}},
		{"ROLLBACK WORK TO SAVEPOINT sp1", false, txStatement{kind: txRollbackTo, savepoint: "sp1"}},
		{"ROLLBACK TRANSACTION TO SAVEPOINT Sp1", true, txStatement{kind: txRollbackTo, savepoint: "sp1"}},
		{"/* undo */ Rollback To Savepoint SP1", false, txStatement{kind: txRollbackTo, savepoint: "sp1"}},
		{"ROLLBACK", false, txStatement{kind: txRollback}},
		{"rollback work", false, txStatement{kind: txRollback}},
		{"ROLLBACK AND CHAIN", true, txStatement{kind: txRollback, chain: true}},
		{"ROLLBACK WORK AND NO CHAIN", false, txStatement{kind: txRollback}},
		{"COMMIT AND CHAIN", false, txStatement{kind: txCommit, chain: true}},
		{"commit transaction and chain", true, txStatement{kind: txCommit, chain: true}},
		{"ABORT", true, txStatement{kind: txRollback}},
		{"ROLLBACK PREPARED 'gid'", true, txStatement{}},
		{"COMMIT", false, txStatement{kind: txCommit}},
		{"commit work", false, txStatement{kind: txCommit}},
		{"END TRANSACTION", true, txStatement{kind: txCommit}},
		{"PREPARE TRANSACTION 'gid'", true, txStatement{kind: txCommit}},
		{"COMMIT PREPARED 'gid'", true, txStatement{}},
		{"PREPARE stmt AS SELECT 1", true, txStatement{}},
		{"CREATE TABLE t (id int)", false, txStatement{kind: txMayCommit}},
		{"alter table t add c int", false, txStatement{kind: txMayCommit}},
		{"LOCK TABLES t WRITE", false, txStatement{kind: txMayCommit}},
		{"START TRANSACTION", false, txStatement{kind: txMayCommit}},
		{"SET autocommit = 1", false, txStatement{kind: txMayCommit}},
		{"TRUNCATE t", false, txStatement{kind: txMayCommit}},
		{"SELECT 1", false, txStatement{}},
		{"(SELECT 1)", false, txStatement{}},
		{"INSERT INTO savepoint_log VALUES (1)", false, txStatement{}},
		{"UPDATE t SET rollback = 1", false, txStatement{}},
		{"WITH x AS (SELECT 1) DELETE FROM t", false, txStatement{}},
		{"SAVEPOINTS", false, txStatement{}},
		{"/* SAVEPOINT sp1 */ SELECT 1", false, txStatement{}},
		{"-- SAVEPOINT sp1\nSELECT 1", false, txStatement{}},
		{"/* unterminated", false, txStatement{}},
		{"", false, txStatement{}},
	} {
		t.Run(fmt.Sprintf("%q", c.query), func(t *testing.T) {
			if got := parseTxStatement(c.query, c.pg); got != c.want {
				t.Errorf("parseTxStatement(%q, pg=%v) = %+v, want %+v", c.query, c.pg, got, c.want)
			}
		})
	}
}
