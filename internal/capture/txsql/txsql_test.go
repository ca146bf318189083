package txsql

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
		want  Statement
	}{
		{"SAVEPOINT sp1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"savepoint SP1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"  \n\tSavePoint Sp1;", true, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{`SAVEPOINT "Sp1"`, true, Statement{Kind: Savepoint, Savepoint: "Sp1"}},
		{`SAVEPOINT "Sp1"`, false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{`SAVEPOINT "a""b"`, true, Statement{Kind: Savepoint, Savepoint: `a"b`}},
		{"SAVEPOINT `Sp1`", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"SAVEPOINT sp$1_x", true, Statement{Kind: Savepoint, Savepoint: "sp$1_x"}},
		{"/* app */ SAVEPOINT sp1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"/* a */ /* b */SAVEPOINT/* c */sp1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"-- app\n-- more\nSAVEPOINT sp1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"# app\nSAVEPOINT sp1", false, Statement{Kind: Savepoint, Savepoint: "sp1"}},
		{"RELEASE SAVEPOINT sp1", false, Statement{Kind: Release, Savepoint: "sp1"}},
		{"release sp1", true, Statement{Kind: Release, Savepoint: "sp1"}},
		{"ROLLBACK TO SAVEPOINT sp1", false, Statement{Kind: RollbackTo, Savepoint: "sp1"}},
		{"rollback to sp1", true, Statement{Kind: RollbackTo, Savepoint: "sp1"}},
		{"ROLLBACK WORK TO SAVEPOINT sp1", false, Statement{Kind: RollbackTo, Savepoint: "sp1"}},
		{"ROLLBACK TRANSACTION TO SAVEPOINT Sp1", true, Statement{Kind: RollbackTo, Savepoint: "sp1"}},
		{"/* undo */ Rollback To Savepoint SP1", false, Statement{Kind: RollbackTo, Savepoint: "sp1"}},
		{"ROLLBACK", false, Statement{Kind: Rollback}},
		{"rollback work", false, Statement{Kind: Rollback}},
		{"ROLLBACK AND CHAIN", true, Statement{Kind: Rollback, Chain: true}},
		{"ROLLBACK WORK AND NO CHAIN", false, Statement{Kind: Rollback}},
		{"COMMIT AND CHAIN", false, Statement{Kind: Commit, Chain: true}},
		{"commit transaction and chain", true, Statement{Kind: Commit, Chain: true}},
		{"ABORT", true, Statement{Kind: Rollback}},
		{"ROLLBACK PREPARED 'gid'", true, Statement{}},
		{"COMMIT", false, Statement{Kind: Commit}},
		{"commit work", false, Statement{Kind: Commit}},
		{"END TRANSACTION", true, Statement{Kind: Commit}},
		{"PREPARE TRANSACTION 'gid'", true, Statement{Kind: Commit}},
		{"COMMIT PREPARED 'gid'", true, Statement{}},
		{"PREPARE stmt AS SELECT 1", true, Statement{}},
		{"CREATE TABLE t (id int)", false, Statement{Kind: MayCommit}},
		{"alter table t add c int", false, Statement{Kind: MayCommit}},
		{"LOCK TABLES t WRITE", false, Statement{Kind: MayCommit}},
		{"START TRANSACTION", false, Statement{Kind: MayCommit}},
		{"SET autocommit = 1", false, Statement{Kind: MayCommit}},
		{"TRUNCATE t", false, Statement{Kind: MayCommit}},
		{"SELECT 1", false, Statement{}},
		{"(SELECT 1)", false, Statement{}},
		{"INSERT INTO savepoint_log VALUES (1)", false, Statement{}},
		{"UPDATE t SET rollback = 1", false, Statement{}},
		{"WITH x AS (SELECT 1) DELETE FROM t", false, Statement{}},
		{"SAVEPOINTS", false, Statement{}},
		{"/* SAVEPOINT sp1 */ SELECT 1", false, Statement{}},
		{"-- SAVEPOINT sp1\nSELECT 1", false, Statement{}},
		{"/* unterminated", false, Statement{}},
		{"", false, Statement{}},
	} {
		t.Run(fmt.Sprintf("%q", c.query), func(t *testing.T) {
			if got := Parse(c.query, c.pg); got != c.want {
				t.Errorf("Parse(%q, pg=%v) = %+v, want %+v", c.query, c.pg, got, c.want)
			}
		})
	}
}
