/* simpler's mailbox hand-off as src/ipc/ implements it (T1 of the reliability
   plan; tests/model/check_model.sh runs it).

   Parent = MailboxEndpoint (mailbox_endpoint.cpp): one publisher thread.
   Child  = MailboxChild (mailbox_child.cpp): the serve loop, and the handler
            thread's RunTicket::complete as one more option of it (under mu_
            a completion cannot interleave with stop() or the exit sweep, and
            it stores only into entries take() already staged).
   Each store to a shared word is its own step, named `model: <step>` here and
   by a `// model: <step>` comment in the C++ where that word is stored or
   loaded; change both together. Stores nobody can observe in between share
   a step: a frame is rewritten only after its hand-back (asserted), and an
   entry's reset fields are read only after its generation.

   Faults (at most CHAOS in all): the child dies before any of its stores or
   while idle (crash, kill -9, or a hang the parent's deadline ends: that path
   is kill, reap, scan, poison, as the liveness path); the test's view of the
   mapping (H4) corrupts a published header (stale, future or even
   generation, index out of range, or torn so that it names another live
   run's entry at its current generation: T5's classes); close() with runs
   in flight. A dead child is replaced once (ForkedChild::replace, reregister()).

   Bounds: K = 2 frames, M = 3 entries (G = 1), R runs, each published
   TASK_READY or staged (PREPARE_READY) and then activated or cancelled.

   Properties (assertions; a deadlock is an invalid end state):
   - every run gets exactly one terminal, and never a wrong "ok";
   - the outcome delivered is the one the child stored, and a terminal the
     child stored is never replaced by the parent's own (stop, death);
   - after the exit sweep nothing is owed (R11);
   - no frame is rewritten while the child reads it; no entry is reoccupied
     while the child may store into it, nor taken twice by the child;
   - no stale or corrupt (index, generation) is accepted (R7, R8);
   - a run executes at most once, with its own payload, and a staged run
     only after its ACTIVATE;
   - the child takes frames in publication order, whichever frame each
     publication filled (a serial handler runs them in that order);
   - with no fault, every run ends with the child's own terminal;
   - under weak fairness the parent always finishes (ltl every_run_ends).

   Not modelled: the acceptance word and set slot (neither frees a frame or
   an entry), control commands (their own words, R19), the wire check. */

#define K 2
#define M 3
#ifndef R
#define R 3
#endif
#ifndef CHAOS
#define CHAOS 1
#endif
#define RESPAWNS 1
#define NI (RESPAWNS + 1)

/* MailboxState, MailboxEndpointState (mailbox_layout.h) */
#define IDLE 0
#define TASK_READY 1
#define FRAME_REFUSED 2
#define FRAME_STAGED 3
#define TASK_DONE 5
#define TASK_FAILED 6
#define ENDPOINT_FAILED 7
#define PREPARE_READY 8
#define ACTIVATE 9
#define CANCEL 10
#define TERMINAL(s) ((s) == TASK_DONE || (s) == TASK_FAILED || (s) == ENDPOINT_FAILED)
#define READY(f) (f_ready[f] == TASK_READY || f_ready[f] == PREPARE_READY)
#define STARTING 0
#define SERVING 1
#define STOPPED 2
#define EXITED 3

/* rc words and delivered outcomes */
#define OK 1
#define FAILED 2   /* the run's own failure */
#define ABORTED 3  /* cancelled, ended unlaunched, swept */
#define INTERNAL 4 /* the parent's verdict on an entry whose rc and state disagree */
#define LOST 5     /* the parent's own terminal: stale refusal, poison, refusal */
#define RESULT(r) ((r) % 2 == 1 -> OK : FAILED)

/* shared words: request frames, entries, control frame */
byte f_ready[K]; byte f_pub[K]; byte f_idx[K]; byte f_gen[K]; byte f_run[K];
byte e_gen[M]; byte e_run[M]; byte e_state[M]; byte e_rc[M]; byte e_ack[M]; byte e_act[M];
byte es; bool shutdown;

/* parent-private: MailboxEndpoint's frame and entry records */
bool p_fbusy[K]; byte p_fent[K]; byte p_fgen[K]; byte p_fpub[K];
bool p_held[M]; byte p_egen[M]; byte p_erun[M]; bool p_estaged[M];
byte p_pub; byte p_nheld; byte nsub = 1; bool poisoned; bool p_shut; byte respawns;

/* child-private (owed_, sealed_, awaiting_, the handler's queue), one set per
   incarnation, so a dead child's leftovers never reach its replacement */
#define O(j) (me * M + (j))
bool c_owed[NI * M]; byte c_owedgen[NI * M]; bool c_sealed[NI];
bool c_started[NI * M]; byte c_stgen[NI * M]; byte c_stpay[NI * M];
bool c_aw[NI * M]; byte c_awgen[NI * M]; byte c_awpay[NI * M];

/* ghosts: read by assertions only */
bool dead[NI]; byte inc;
bool f_bad[K];         /* the header holds a value the parent did not write */
bool reading[K];       /* the current child still needs this frame's contents */
bool c_holds[NI * M];  /* the child may still store into this entry */
byte c_taken[NI];      /* bit p: this incarnation took the frame of publication p */
byte executed[R + 1]; byte term[R + 1]; byte want[R + 1];
bool own[R + 1]; bool activated[R + 1]; bool staged_run[R + 1];
byte chaos; bool done;

/* A child store, unless the child dies just before it. */
#define GONE dead[me] = true; reading[0] = false; reading[1] = false
#define DIE atomic { chaos < CHAOS -> chaos++; GONE }; goto gone
#define CSTORE(stmts) if :: atomic { stmts } :: DIE fi

/* MailboxChild::complete: the owed record and the entry's generation, then
   rc (and text, disposition), then the terminal as the entry's last store. */
inline complete(j, g, code) {
  atomic {
    go = !c_sealed[me] && c_owed[O(j)] && c_owedgen[O(j)] == g;
    if :: go -> c_owed[O(j)] = false; go = (e_gen[j] == g)           /* model: complete_generation */
       :: else fi;
    if :: !go -> c_holds[O(j)] = false :: else fi }
  if
  :: go ->
#ifdef MUTANT_TERMINAL_NOT_LAST
     CSTORE(e_state[j] = (code == OK -> TASK_DONE : TASK_FAILED));
     CSTORE(want[e_run[j]] = code; e_rc[j] = code; c_holds[O(j)] = false)
#else
     CSTORE(want[e_run[j]] = code; e_rc[j] = code);                   /* model: complete_rc */
     CSTORE(e_state[j] = (code == OK -> TASK_DONE : TASK_FAILED); c_holds[O(j)] = false)  /* model: terminal */
#endif
  :: else
  fi
}

#define AWAKE(j) (c_aw[O(j)] && (e_gen[j] != c_awgen[O(j)] || e_act[j] != 0))
#define STARTED(j) c_started[O(j)]

/* The handler thread runs a started run, then completes it. */
inline run_started() {
  atomic {
    STARTED(0) || STARTED(1) || STARTED(2) ->
    if :: STARTED(0) -> j = 0 :: STARTED(1) -> j = 1 :: STARTED(2) -> j = 2 fi;
    c_started[O(j)] = false; g = c_stgen[O(j)]; pay = c_stpay[O(j)];
    assert(pay == e_run[j]);                     /* its own payload, in its own entry */
    assert(executed[pay] == 0);                  /* at most once */
    assert(!staged_run[pay] || activated[pay]);  /* a staged run only after ACTIVATE */
    executed[pay]++ }
  complete(j, g, RESULT(pay))
}

proctype Child(byte me) {
  byte f, p, idx, g, pay, j;
  bool stg, bad, go;
  CSTORE(es = SERVING);                                                 /* model: init_ready */
end_serve:
  do
  :: DIE
  :: shutdown -> break                                                  /* model: see_shutdown */
  /* oldest_ready_frame's two scans are one step: the second sees every
     frame published before one the first saw (the argument is in the .cpp) */
  :: atomic { READY(0) || READY(1) ->                                   /* model: take_ready */
#ifdef MUTANT_FRAME_ORDER
       if :: READY(0) -> f = 0 :: READY(1) -> f = 1 fi;
#else
       if :: READY(0) && (!READY(1) || f_pub[0] < f_pub[1]) -> f = 0 :: else -> f = 1 fi;
#endif
       stg = (f_ready[f] == PREPARE_READY);
       p = f_pub[f]; reading[f] = (p != 0);                             /* model: take_publication */
       if
       :: p != 0 ->
          assert((c_taken[me] & ((1 << p) - 2)) == (1 << p) - 2);      /* every earlier publication taken first */
          c_taken[me] = c_taken[me] | (1 << p)
       :: else
       fi }
     atomic { idx = f_idx[f]; g = f_gen[f]; bad = f_bad[f] }            /* model: take_header */
     if :: idx >= M || g % 2 == 0 -> goto stop :: else fi;              /* unattributable */
#ifndef MUTANT_NO_GENERATION_CHECK
     /* stale, unpublished, or a second frame for an occupant already served */
     if
#ifdef MUTANT_NO_REPLAY_CHECK
     :: e_gen[idx] != g || p == 0 ->
#else
     :: e_gen[idx] != g || p == 0 || e_state[idx] != IDLE ->            /* model: check_generation */
#endif
        CSTORE(reading[f] = false; f_ready[f] = FRAME_REFUSED);         /* model: refuse_stale */
        goto next
     :: else
     fi;
#endif
#ifdef MUTANT_ACK_BEFORE_COPY
     CSTORE(e_state[idx] = FRAME_STAGED);
     CSTORE(f_ready[f] = IDLE);
     CSTORE(e_ack[idx] = p);
#endif
     pay = f_run[f];                                                    /* model: copy */
     atomic {
       go = (f_pub[f] == p);                                            /* model: recheck */
       reading[f] = false;
       if
       :: go ->
          assert(!bad);              /* no stale or corrupt (index, generation) accepted */
          assert(!c_holds[O(idx)]);  /* no entry taken twice */
          c_owed[O(idx)] = true; c_owedgen[O(idx)] = g; c_holds[O(idx)] = true
       :: else
       fi }
     if :: !go -> goto next :: else fi;
#ifndef MUTANT_ACK_BEFORE_COPY
     CSTORE(e_state[idx] = FRAME_STAGED);                               /* model: stage */
     CSTORE(f_ready[f] = IDLE);                                         /* model: frame_idle */
     CSTORE(e_ack[idx] = p);                                            /* model: ack */
#endif
     if
     :: stg -> c_aw[O(idx)] = true; c_awgen[O(idx)] = g; c_awpay[O(idx)] = pay
     :: else -> c_started[O(idx)] = true; c_stgen[O(idx)] = g; c_stpay[O(idx)] = pay
     fi;
     goto next
  :: atomic { AWAKE(0) || AWAKE(1) || AWAKE(2) ->                       /* model: serve_activation */
       if :: AWAKE(0) -> j = 0 :: AWAKE(1) -> j = 1 :: AWAKE(2) -> j = 2 fi;
       c_aw[O(j)] = false; g = c_awgen[O(j)];
       if
       :: e_gen[j] == g && e_act[j] == ACTIVATE ->
          c_started[O(j)] = true; c_stgen[O(j)] = g; c_stpay[O(j)] = c_awpay[O(j)]; c_awpay[O(j)] = 0; j = M
       :: else
       fi }
     if :: j < M -> complete(j, g, ABORTED) :: else fi;
     goto next
  :: run_started();
next:
     atomic { f = 0; p = 0; idx = 0; g = 0; pay = 0; j = 0; stg = false; bad = false; go = false }
  od;
  /* shutdown: staged runs end unlaunched; the handler's drain finishes what
     it started, or abandons it to the exit sweep, keyed on parity */
  for (j : 0 .. M - 1) {
    if :: c_aw[O(j)] -> c_aw[O(j)] = false; g = c_awgen[O(j)]; complete(j, g, ABORTED) :: else fi
  };
  do
  :: run_started()
  :: break
  od;
  atomic { c_sealed[me] = true; for (j : 0 .. M - 1) { c_holds[O(j)] = false } };
  for (j : 0 .. M - 1) {
#ifdef MUTANT_SWEEP_BY_STATE
    if :: e_gen[j] % 2 == 1 && e_state[j] != IDLE && !TERMINAL(e_state[j]) ->
#else
    if :: e_gen[j] % 2 == 1 && !TERMINAL(e_state[j]) ->                 /* model: sweep */
#endif
          CSTORE(want[e_run[j]] = ABORTED; e_rc[j] = ABORTED);
          CSTORE(e_state[j] = ENDPOINT_FAILED)
       :: else
    fi
  };
  CSTORE(es = EXITED);                                                  /* model: exited */
  atomic { GONE };
  goto gone;
stop:
  atomic { reading[f] = false; c_sealed[me] = true; for (j : 0 .. M - 1) { c_holds[O(j)] = false } };
  CSTORE(es = STOPPED);                                                 /* model: stop */
  atomic { GONE };
gone: skip
}

/* ---- parent ---- */

inline release(j) {
#ifndef MUTANT_RELEASE_KEEPS_FRAME
  for (f : 0 .. K - 1) {
    if :: p_fbusy[f] && p_fent[f] == j && p_fgen[f] == p_egen[j] -> p_fbusy[f] = false :: else fi
  };
#endif
  p_held[j] = false; p_nheld--; p_egen[j]++; p_erun[j] = 0; p_estaged[j] = false;
  e_gen[j] = p_egen[j]                                                  /* model: release */
}

inline deliver(r, o, mine) { assert(term[r] == 0); term[r]++; own[r] = mine; assert(o != OK || executed[r] == 1) }

/* scan_entries: a terminal the child stored is that run's outcome */
inline scan(j) {
  if
  :: e_state[j] == TASK_DONE -> o = (e_rc[j] == OK -> OK : INTERNAL)
  :: else -> o = ((e_rc[j] != 0 && e_rc[j] != OK) -> e_rc[j] : INTERNAL)
  fi;
  assert(o == want[p_erun[j]]);
  deliver(p_erun[j], o, true);
  release(j)
}

inline scan_all() {
  for (j : 0 .. M - 1) { if :: p_held[j] && TERMINAL(e_state[j]) -> scan(j) :: else fi }  /* model: scan_terminal */
}

/* poison: every held run ends here, with this side's one cause */
inline poison(cause) {
  poisoned = true;
  for (j : 0 .. M - 1) {
    if
    :: p_held[j] ->
       assert(!TERMINAL(e_state[j]));  /* never over a terminal the child stored */
       assert(cause != EXITED);        /* the exit sweep left nothing owed */
       deliver(p_erun[j], LOST, false);
       release(j)
    :: else
    fi
  };
  for (f : 0 .. K - 1) { p_fbusy[f] = false }
}

#define FREE_FRAME (!p_fbusy[0] || !p_fbusy[1])
#define FREE_ENTRY (!p_held[0] || !p_held[1] || !p_held[2])
#define ACKED(f) (p_fbusy[f] && e_ack[p_fent[f]] == p_fpub[f])
#define REFUSED(f) (p_fbusy[f] && f_ready[f] == FRAME_REFUSED)
#define DONE_ENTRY(j) (p_held[j] && TERMINAL(e_state[j]))
#define STAGED(j) (p_held[j] && p_estaged[j])
#define PUBLISHED(f) (READY(f) && f_pub[f] != 0 && !f_bad[f])

active proctype Parent() {
  byte f, i, j, r, o, c;
  bool stg;
  run Child(0);
  do
  :: nsub > R && p_nheld == 0 -> break
  /* publish, having consulted available_request_transport() */
  :: atomic {
       !poisoned && !p_shut && es != STARTING && nsub <= R && FREE_FRAME && FREE_ENTRY ->
       if :: !p_fbusy[0] -> f = 0 :: else -> f = 1 fi;
       if :: !p_held[0] -> i = 0 :: !p_held[1] -> i = 1 :: !p_held[2] -> i = 2 fi;  /* any allocation order */
       if :: stg = true :: stg = false fi;
       assert(!c_holds[inc * M + i] || dead[inc]);  /* no entry reoccupied while the child holds it */
       assert(!reading[f]);                         /* no frame rewritten while the child reads it */
       assert(!(p_fbusy[0] && p_fent[0] == i) && !(p_fbusy[1] && p_fent[1] == i));  /* nor an ACK erased that a frame awaits */
       r = nsub; nsub++; staged_run[r] = stg;
       p_held[i] = true; p_nheld++; p_egen[i]++; p_erun[i] = r; p_estaged[i] = stg;
       e_run[i] = r; e_state[i] = IDLE; e_rc[i] = 0; e_ack[i] = 0;
#ifndef MUTANT_NO_ACTIVATION_RESET
       e_act[i] = 0;
#endif
       e_gen[i] = p_egen[i];                                              /* model: occupy */
       f_pub[f] = 0;                                                      /* model: unpublish */
#ifdef MUTANT_PUBLISH_BEFORE_FILL
       p_pub++; f_pub[f] = p_pub; f_ready[f] = (stg -> PREPARE_READY : TASK_READY) };
     atomic {
#endif
       f_idx[f] = i; f_gen[f] = p_egen[i]; f_bad[f] = false;              /* model: fill_header */
       f_run[f] = r;                                                      /* model: fill_payload */
#ifndef MUTANT_PUBLISH_BEFORE_FILL
       p_pub++; f_pub[f] = p_pub;                                         /* model: publish */
       f_ready[f] = (stg -> PREPARE_READY : TASK_READY);                  /* model: ready */
#endif
       p_fbusy[f] = true; p_fent[f] = i; p_fgen[f] = p_egen[i]; p_fpub[f] = p_pub;
       f = 0; i = 0; r = 0; stg = false }
  :: atomic { !poisoned && (STAGED(0) || STAGED(1) || STAGED(2)) ->
       if :: STAGED(0) -> j = 0 :: STAGED(1) -> j = 1 :: STAGED(2) -> j = 2 fi;
       p_estaged[j] = false;
       if :: activated[p_erun[j]] = true; e_act[j] = ACTIVATE             /* model: activate */
          :: e_act[j] = CANCEL fi;
       j = 0 }
  /* poll: reclaim_frames, then scan_entries */
  :: atomic { ACKED(0) || ACKED(1) ->                                     /* model: reclaim_ack */
       if :: ACKED(0) -> p_fbusy[0] = false :: ACKED(1) -> p_fbusy[1] = false fi }
  :: atomic { REFUSED(0) || REFUSED(1) ->                                 /* model: reclaim_refused */
       if :: REFUSED(0) -> f = 0 :: REFUSED(1) -> f = 1 fi;
       p_fbusy[f] = false; i = p_fent[f];
       if :: p_held[i] && p_egen[i] == p_fgen[f] -> deliver(p_erun[i], LOST, false); release(i) :: else fi;
       f = 0; i = 0 }
  :: atomic { DONE_ENTRY(0) || DONE_ENTRY(1) || DONE_ENTRY(2) ->
       if :: DONE_ENTRY(0) -> j = 0 :: DONE_ENTRY(1) -> j = 1 :: DONE_ENTRY(2) -> j = 2 fi;
       scan(j); f = 0; j = 0; o = 0 }                                     /* model: scan_terminal */
#ifdef MUTANT_STOP_READ_AFTER_SCAN
  :: atomic { !poisoned && (p_nheld > 0 || es >= STOPPED) -> scan_all(); f = 0; j = 0; o = 0 }
     atomic { if :: !poisoned && es >= STOPPED -> c = es; poison(c); f = 0; j = 0; c = 0 :: else fi }
#else
  :: atomic { !poisoned && es >= STOPPED ->                               /* model: poll_endpoint_state */
       c = es; scan_all(); poison(c); f = 0; j = 0; o = 0; c = 0 }
#endif
  :: atomic { !poisoned && es < STOPPED && dead[inc] ->                   /* model: liveness */
       scan_all(); poison(LOST); f = 0; j = 0; o = 0 }
  /* close() with runs in flight */
  :: atomic { chaos < CHAOS && !p_shut -> chaos++; p_shut = true; shutdown = true }  /* model: request_shutdown */
  /* H4: a published header corrupted through the test's view of the mapping */
  :: atomic { chaos < CHAOS && (PUBLISHED(0) || PUBLISHED(1)) ->
       chaos++;
       if :: PUBLISHED(0) -> f = 0 :: PUBLISHED(1) -> f = 1 fi;
       if
       :: f_gen[f] >= 3 -> f_gen[f] = f_gen[f] - 2                        /* an earlier occupant's: stale */
       :: f_gen[f] = f_gen[f] + 2                                         /* a later one's: stale */
       :: f_gen[f] = f_gen[f] + 1                                         /* even: unattributable */
       :: f_idx[f] = M                                                    /* out of range: unattributable */
       :: atomic { (f_idx[f] + 1) % M != f_idx[f] && p_held[(f_idx[f] + 1) % M] &&
            e_state[(f_idx[f] + 1) % M] != IDLE ->                         /* torn: a live run's (index, generation) */
            f_gen[f] = e_gen[(f_idx[f] + 1) % M]; f_idx[f] = (f_idx[f] + 1) % M }
       fi;
       f_bad[f] = true; f = 0 }
  /* the dead child is replaced once: every word as create() wrote it */
  :: atomic { poisoned && dead[inc] && !p_shut && respawns < RESPAWNS ->  /* model: reregister */
       for (f : 0 .. K - 1) { f_ready[f] = 0; f_pub[f] = 0; f_idx[f] = 0; f_gen[f] = 0; f_run[f] = 0; f_bad[f] = false };
       for (j : 0 .. M - 1) { e_gen[j] = 0; e_run[j] = 0; e_state[j] = 0; e_rc[j] = 0; e_ack[j] = 0; e_act[j] = 0; p_egen[j] = 0 };
       es = STARTING; p_pub = 0; poisoned = false; respawns++; inc++; f = 0; j = 0;
       run Child(inc) }
  /* no child will serve again: what is left is refused */
  :: atomic { poisoned && (p_shut || respawns == RESPAWNS) && nsub <= R -> deliver(nsub, LOST, false); nsub++ }
  od;
  for (r : 1 .. R) {
    assert(term[r] == 1);
    assert(executed[r] <= 1);
    assert(chaos > 0 || own[r])  /* with no fault, every run ends with the child's own terminal */
  };
  assert(!p_fbusy[0] && !p_fbusy[1]);  /* no request frame leaked */
  done = true
}

ltl every_run_ends { <> done }
