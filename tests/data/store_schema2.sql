-- A store written by schema version 2 (forge before key hashing), with data: the upgrade test loads it.
BEGIN TRANSACTION;
CREATE TABLE call (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	rollout_id VARCHAR NOT NULL, 
	seq INTEGER NOT NULL, 
	api VARCHAR NOT NULL, 
	model VARCHAR NOT NULL, 
	adapter VARCHAR, 
	stream BOOLEAN NOT NULL, 
	status VARCHAR NOT NULL, 
	request_json TEXT, 
	response_json TEXT, 
	prompt_ids TEXT, 
	completion_ids TEXT, 
	logprobs TEXT, 
	tool_calls_json TEXT, 
	tool_parse_error BOOLEAN NOT NULL, 
	reused_tokens INTEGER NOT NULL, 
	finish_reason VARCHAR, 
	error VARCHAR, 
	prompt_tokens INTEGER NOT NULL, 
	completion_tokens INTEGER NOT NULL, 
	latency_ms FLOAT, 
	started_at DATETIME NOT NULL, 
	ended_at DATETIME, 
	PRIMARY KEY (id)
);
INSERT INTO "call" VALUES(1,'run-20261201-aaaaaaaaaa','ro-20261202-631929c812',0,'','',NULL,0,'ok',NULL,NULL,'[0, 1]',NULL,NULL,NULL,0,0,NULL,NULL,0,0,NULL,'2026-12-02 18:52:38.995684',NULL);
INSERT INTO "call" VALUES(2,'run-20261201-aaaaaaaaaa','ro-20261202-631929c812',1,'','',NULL,0,'ok',NULL,NULL,'[1, 2]',NULL,NULL,NULL,0,0,NULL,NULL,0,0,NULL,'2026-12-02 18:52:38.999437',NULL);
INSERT INTO "call" VALUES(3,'run-20261201-aaaaaaaaaa','ro-20261202-631929c812',1,'','',NULL,0,'ok',NULL,NULL,'[2, 3]',NULL,NULL,NULL,0,0,NULL,NULL,0,0,NULL,'2026-12-02 18:52:39.000631',NULL);
INSERT INTO "call" VALUES(4,'run-20261201-aaaaaaaaaa','ro-20261202-631929c812',2,'','',NULL,0,'ok',NULL,NULL,'[3, 4]',NULL,NULL,NULL,0,0,NULL,NULL,0,0,NULL,'2026-12-02 18:52:39.001652',NULL);
INSERT INTO "call" VALUES(5,'run-20261201-aaaaaaaaaa','ro-20261202-d26d5e5504',0,'','',NULL,0,'ok',NULL,NULL,'[9]',NULL,NULL,NULL,0,0,NULL,NULL,0,0,NULL,'2026-12-02 18:52:39.002460',NULL);
CREATE TABLE checkpoint (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	step INTEGER NOT NULL, 
	kind VARCHAR NOT NULL, 
	path VARCHAR NOT NULL, 
	adapter_name VARCHAR, 
	loaded BOOLEAN NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES run (id)
);
CREATE TABLE rollout (
	id VARCHAR NOT NULL, 
	run_id VARCHAR NOT NULL, 
	task_id VARCHAR NOT NULL, 
	step INTEGER NOT NULL, 
	sample_index INTEGER NOT NULL, 
	sandbox VARCHAR NOT NULL, 
	sandbox_id VARCHAR, 
	harness VARCHAR NOT NULL, 
	adapter VARCHAR, 
	api_key VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	reward FLOAT, 
	attempts INTEGER NOT NULL, 
	exit_code INTEGER, 
	stdout TEXT, 
	stderr TEXT, 
	verifier_output TEXT, 
	error VARCHAR, 
	n_calls INTEGER NOT NULL, 
	n_tokens INTEGER NOT NULL, 
	n_segments INTEGER NOT NULL, 
	n_extends INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	ended_at DATETIME, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES run (id)
);
INSERT INTO "rollout" VALUES('ro-20261202-d26d5e5504','run-20261201-aaaaaaaaaa','t1',0,0,'',NULL,'',NULL,'forge-old-key-1','scored',1.0,0,NULL,NULL,NULL,NULL,NULL,0,0,0,0,'2026-12-02 18:52:38.985021',NULL,NULL);
INSERT INTO "rollout" VALUES('ro-20261202-631929c812','run-20261201-aaaaaaaaaa','t2',0,0,'',NULL,'',NULL,'forge-old-key-2','running',NULL,0,NULL,NULL,NULL,NULL,NULL,0,0,0,0,'2026-12-02 18:52:38.994387',NULL,NULL);
CREATE TABLE run (
	id VARCHAR NOT NULL, 
	name VARCHAR NOT NULL, 
	kind VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	config_json TEXT, 
	summary_json TEXT, 
	owner_pid INTEGER, 
	current_adapter VARCHAR, 
	error VARCHAR, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	ended_at DATETIME, 
	PRIMARY KEY (id)
);
INSERT INTO "run" VALUES('run-20261201-aaaaaaaaaa','old','train','created','{"a": 1}',NULL,NULL,NULL,NULL,'2026-12-02 18:52:38.977808',NULL,NULL);
CREATE TABLE schema_migrations (
	version INTEGER NOT NULL, 
	name VARCHAR NOT NULL, 
	applied_at DATETIME NOT NULL, 
	PRIMARY KEY (version)
);
INSERT INTO "schema_migrations" VALUES(1,'initial schema','2026-12-02 18:52:38.962630');
INSERT INTO "schema_migrations" VALUES(2,'index rollout(run_id, status)','2026-12-02 18:52:38.963964');
CREATE TABLE task (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	task_id VARCHAR NOT NULL, 
	instruction VARCHAR NOT NULL, 
	spec_json TEXT, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES run (id)
);
CREATE TABLE trainstep (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	step INTEGER NOT NULL, 
	loss FLOAT, 
	reward_mean FLOAT, 
	reward_std FLOAT, 
	pass_rate FLOAT, 
	kl FLOAT, 
	clip_frac FLOAT, 
	mismatch_mean FLOAT, 
	mismatch_max FLOAT, 
	grad_norm FLOAT, 
	tokens_per_s FLOAT, 
	n_tokens INTEGER NOT NULL, 
	n_rollouts INTEGER NOT NULL, 
	t_rollout_s FLOAT, 
	t_train_s FLOAT, 
	t_sync_s FLOAT, 
	adapter VARCHAR, 
	metrics_json TEXT, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES run (id)
);
CREATE TABLE trajectory (
	id INTEGER NOT NULL, 
	run_id VARCHAR NOT NULL, 
	rollout_id VARCHAR NOT NULL, 
	segment INTEGER NOT NULL, 
	token_ids TEXT, 
	loss_mask TEXT, 
	logprobs TEXT, 
	call_ids TEXT, 
	n_tokens INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id)
);
CREATE INDEX ix_call_run_id ON call (run_id);
CREATE INDEX ix_call_rollout_id ON call (rollout_id);
CREATE INDEX ix_call_rollout_seq ON call (rollout_id, seq);
CREATE UNIQUE INDEX ix_traj_rollout_seg ON trajectory (rollout_id, segment);
CREATE INDEX ix_trajectory_run_id ON trajectory (run_id);
CREATE INDEX ix_trajectory_rollout_id ON trajectory (rollout_id);
CREATE UNIQUE INDEX ix_task_run_key ON task (run_id, task_id);
CREATE INDEX ix_task_run_id ON task (run_id);
CREATE INDEX ix_rollout_run_status ON rollout (run_id, status);
CREATE INDEX ix_rollout_task_id ON rollout (task_id);
CREATE INDEX ix_rollout_run_id ON rollout (run_id);
CREATE UNIQUE INDEX ix_rollout_api_key ON rollout (api_key);
CREATE INDEX ix_trainstep_run_id ON trainstep (run_id);
CREATE UNIQUE INDEX ix_step_run_step ON trainstep (run_id, step);
CREATE INDEX ix_checkpoint_run_id ON checkpoint (run_id);
COMMIT;
