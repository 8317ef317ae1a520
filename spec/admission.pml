/*
 * flashgate's admission protocol, as a Promela model checked by spin.
 * docs/verification.md maps each step to the code and says what the model
 * leaves out.
 *
 * Configuration (exhaustive for it): one sale of N = 2 units split over two
 * buckets, one unit each; per-user limit 1; two buyers whose homes are the
 * two buckets. Four purchases, each with its own order id and gateway:
 *   o0  buyer 0, with an idempotency key
 *   o1  buyer 0 again, with the same key (the retry)
 *   o2  buyer 1
 *   o3  buyer 1 again, without a key (a second purchase, over the limit)
 * o0 holds a purchase-limit charge (its phone's) in bucket 1
 * before its admission in bucket 0. o2's gateway, if its home bucket is empty,
 * gathers a unit from the other (take, then give). An admission call may
 * time out: the gateway answers 503, releases, and the call runs after. A
 * publish may land, be lost, or land and time out; a gateway may die between
 * its admission and its publish (the orphan is republished by reconcile).
 * The backends take messages from the stream (claim, decide in MySQL under
 * the sale row lock, write back with the epoch), any message at any time
 * (redelivery), and one may die after MySQL decided. Buyer 1 cancels o2 if
 * it is confirmed, or it expires (the cancel keeps the buyer's quota, the
 * expiry gives it back). The leader may rebuild Redis (the one rebuild,
 * with its epoch) at any moment, and Redis may lose all its data once; the
 * gateway that meets the cold sale asks for a rebuild.
 *
 * When everything has ended, the leader reconciles (orphans republished and
 * written, a cold sale rebuilt, cancels restocked again), and then, with
 * docs/design.md §2's numbers:
 *   1 no oversell            MySQL sold <= N (asserted at every decision too)
 *   2 per-user limit         MySQL units per buyer <= LIMIT
 *   3 nothing lost           every 202 is an order MySQL confirmed (or then
 *                            canceled); Redis remaining + reserved + sold = N,
 *                            and Redis counts each buyer and the phone as
 *                            MySQL does
 *   4 idempotent             a 202 of the key names one order; a retry of a
 *                            key whose order lives is never refused as over
 *                            the limit
 *   6 a refusal is final     a 503 never becomes an order
 *   9 Redis is derived       3's ledger holds after every write from before
 *                            the last rebuild has landed
 *
 * Bug switches (-DBUG_…) put back bugs the code had; `make verify` checks
 * that spin finds a violation with each and none without any.
 */

#define N      2   /* units */
#define LIMIT  1   /* per buyer */
#define NO     4   /* orders */
#define PHMAX  2   /* the phone's limit (orders), counted in bucket 1 */

/* MySQL's order status */
#define M_NONE      0
#define M_CONFIRMED 1
#define M_FAILED    2
#define M_CANCELED  3

/* Redis's record status */
#define R_NONE       0
#define R_PENDING    1
#define R_PROCESSING 2
#define R_RELEASED   3   /* a release's record, or a tombstone */
#define R_FAILED     4
#define R_CONFIRMED  5
#define R_CANCELED   6

#define REBUILDING 255

/* BUG_COLD_CLAIM: the old claim answered 'unknown' on a tag Redis had lost,
 * and MySQL decided the order at once */
#ifdef BUG_COLD_CLAIM
#define COLD true
#else
#define COLD false
#endif

/* admit.lua's answers */
#define A_OK      0
#define A_REPLAY  1
#define A_COLD    2   /* not warm: 503 */
#define A_REFUSED 3   /* limit, sold out: 4xx */
#define A_DUPID   4   /* the id is taken: 503 */

/* ---- Redis: lost all at once ---- */
bool meta[2];
byte stock[2];
byte ucount[2];        /* buyer u's units, in bucket u (its home) */
bool resv[NO];         /* each in its buyer's home bucket */
byte rec[NO];
byte idem;             /* buyer 0's key → order id + 1 (0: none) */
bool restocked[NO];
byte epochKey[2];      /* 0 absent, REBUILDING, else the epoch */
byte ph;               /* the phone's counter, in bucket 1 */
bool hold[NO];         /* an undecided hold of the order's phone charge */
bool held[NO];         /* a kept hold */
byte xunits;           /* one transfer on the move: units, giver, its epoch */
byte xfrom;
byte xepoch;

/* ---- Redis's replicas (redis.wait_replicas): what a failover keeps ----
 * The replica holds the master's writes up to the last WAIT that succeeded
 * (sync); a failover makes it the master, losing what came after. Without
 * replicas (-DNO_REPLICAS) a loss is all of Redis's data at once. */
#ifndef NO_REPLICAS
bool r_meta[2];
byte r_stock[2];
byte r_ucount[2];
bool r_resv[NO];
byte r_rec[NO];
byte r_idem;
bool r_restocked[NO];
byte r_epochKey[2];
byte r_ph;
bool r_hold[NO];
bool r_held[NO];
byte r_xunits;
byte r_xfrom;
byte r_xepoch;
#endif

/* ---- MySQL and the stream: durable ---- */
byte st[NO];
byte sold;
byte units[2];
byte mepoch = 1;       /* the sale's creation was a rebuild */
bool mlock;            /* the sale row lock */
bool stream[NO];

/* ---- what the clients were told ---- */
bool r202[NO];         /* a 202 naming this order */
bool r503[NO];         /* this order's purchase answered 503 */
byte kans[2];          /* the keyed purchases' answers: o+1 (202), 100 (503), 101 (4xx), 102 (a replay's 202 of a failed order) */

byte aepoch[NO];       /* the epoch the order was admitted in (its id's time against the last rebuild's) */
bool unk[NO];          /* its last claim found no record (claim.lua 'unknown') */
byte cep[NO];          /* the tag's epoch its last claim read */
bool kept[NO];         /* canceled by its buyer, who keeps the quota (not an expiry) */

byte running;          /* purchases and the cancel, still under way */
byte lost;             /* Redis losses left */
byte losses;           /* Redis losses so far */
byte rebuilds;         /* spontaneous rebuilds left */
byte crashes = 1;      /* backend deaths left */
bool rbusy;            /* a rebuild is running */
byte pubs;             /* gateways between an admission and the end of its publish */

#define home(o) ((o) / 2)   /* o0, o1: buyer 0; o2, o3: buyer 1 */

/* copy(a, b): every Redis variable b into a */
#define copyRedis(A, B) \
  A##meta[0] = B##meta[0]; A##meta[1] = B##meta[1]; A##stock[0] = B##stock[0]; A##stock[1] = B##stock[1]; \
  A##ucount[0] = B##ucount[0]; A##ucount[1] = B##ucount[1]; \
  A##resv[0] = B##resv[0]; A##resv[1] = B##resv[1]; A##resv[2] = B##resv[2]; A##resv[3] = B##resv[3]; \
  A##rec[0] = B##rec[0]; A##rec[1] = B##rec[1]; A##rec[2] = B##rec[2]; A##rec[3] = B##rec[3]; \
  A##idem = B##idem; \
  A##restocked[0] = B##restocked[0]; A##restocked[1] = B##restocked[1]; A##restocked[2] = B##restocked[2]; A##restocked[3] = B##restocked[3]; \
  A##epochKey[0] = B##epochKey[0]; A##epochKey[1] = B##epochKey[1]; A##ph = B##ph; \
  A##hold[0] = B##hold[0]; A##hold[1] = B##hold[1]; A##hold[2] = B##hold[2]; A##hold[3] = B##hold[3]; \
  A##held[0] = B##held[0]; A##held[1] = B##held[1]; A##held[2] = B##held[2]; A##held[3] = B##held[3]; \
  A##xunits = B##xunits; A##xfrom = B##xfrom; A##xepoch = B##xepoch

#define clearReplica() \
  r_meta[0] = 0; r_meta[1] = 0; r_stock[0] = 0; r_stock[1] = 0; r_ucount[0] = 0; r_ucount[1] = 0; \
  r_resv[0] = 0; r_resv[1] = 0; r_resv[2] = 0; r_resv[3] = 0; r_rec[0] = 0; r_rec[1] = 0; r_rec[2] = 0; r_rec[3] = 0; \
  r_idem = 0; r_restocked[0] = 0; r_restocked[1] = 0; r_restocked[2] = 0; r_restocked[3] = 0; \
  r_epochKey[0] = 0; r_epochKey[1] = 0; r_ph = 0; r_hold[0] = 0; r_hold[1] = 0; r_hold[2] = 0; r_hold[3] = 0; \
  r_held[0] = 0; r_held[1] = 0; r_held[2] = 0; r_held[3] = 0; r_xunits = 0; r_xfrom = 0; r_xepoch = 0

/* sync: a WAIT that succeeded (the replica has every write so far) */
/* Once the one failover has happened the replica no longer matters: it is
 * left as zeros (a smaller state space). */
#ifndef NO_REPLICAS
inline sync() { atomic { if :: lost > 0 -> copyRedis(r_, ) :: else -> skip fi } }
#else
inline sync() { skip }
#endif
/* waited(ws): the WAIT after a write made when losses was ws succeeds; it
 * cannot after a failover since (the connection to the old master broke) */
#ifndef NO_REPLICAS
inline waited(ws) { atomic { losses == ws -> if :: lost > 0 -> copyRedis(r_, ) :: else -> skip fi } }
#else
inline waited(ws) { skip }
#endif

/* the tag is warm: its meta is there and its epoch is MySQL's (a failover
 * back to a replica from before a rebuild is not warm: warmer.isWarm) */
#define warmTag(b) (meta[b] && epochKey[b] == mepoch)

inline lock() { atomic { !mlock -> mlock = true } }
inline unlock() { mlock = false }

inline unholdNow(o) {
  if
  :: hold[o] || held[o] -> hold[o] = false; held[o] = false; ph--
  :: else -> skip
  fi
}

/* admit.lua on buyer u's home bucket */
inline admit(u, o, key, res, rid) {
  atomic {
    if
    :: !meta[u] -> res = A_COLD
    :: else ->
      if
      :: key && idem != 0 -> res = A_REPLAY; rid = idem - 1
      :: else ->
        if
        :: rec[o] != R_NONE -> res = A_DUPID
        :: rec[o] == R_NONE && (ucount[u] >= LIMIT || stock[u] == 0) -> res = A_REFUSED
        :: else ->
          stock[u]--; ucount[u]++; resv[o] = true; rec[o] = R_PENDING; aepoch[o] = mepoch;
          if :: key -> idem = o + 1 :: else -> skip fi;
          res = A_OK
        fi
      fi
    fi
  }
}

/* release.lua, gateway mode: rel 1 when the order lives on (claimed or
 * decided: the gateway answers 202), 0 when released or tombstoned (503) */
inline releaseGw(o, rel) {
  atomic {
    if
    :: rec[o] == R_NONE ->
#ifndef BUG_NO_TOMBSTONE
      rec[o] = R_RELEASED;
#endif
      rel = 0
    :: rec[o] == R_PROCESSING || rec[o] == R_CONFIRMED || rec[o] == R_CANCELED -> rel = 1
    :: rec[o] == R_RELEASED || rec[o] == R_FAILED -> rel = 0
    :: rec[o] == R_PENDING ->
      if
      :: resv[o] ->
        resv[o] = false; stock[home(o)]++; ucount[home(o)]--;
        if :: home(o) == 0 && idem == o + 1 -> idem = 0 :: else -> skip fi;
        unholdNow(o)   /* the charges held away go back too (lua.giveBack) */
      :: else -> skip
      fi;
      rec[o] = R_RELEASED; rel = 0
    fi
  }
}

/* a gateway's release under redis.wait_replicas (lua.Scripts.Release): its
 * answer counts only once a WAIT after it succeeded; until then it is run
 * again (a failover meanwhile may have lost it: the next run decides anew) */
inline releaseW(o, rel, ws) {
#if defined(NO_REPLICAS) || defined(BUG_RELEASE_NO_WAIT)
  releaseGw(o, rel)
#else
  do
  :: atomic { releaseGw(o, rel); ws = losses };
    if
    :: waited(ws); break
    :: skip   /* fewer replicas within the wait: again */
    fi
  od
#endif
}

/* hold.lua in bucket 1, and unhold.lua keep or give */
inline holdPhone(o, ok) {
  atomic {
    if
    :: meta[1] && ph < PHMAX && !hold[o] && !held[o] -> ph++; hold[o] = true; ok = true
    :: else -> ok = false
    fi
  }
}
inline unhold(o, keep) {
  atomic {
    if
    :: keep && hold[o] -> hold[o] = false; held[o] = true
    :: !keep -> unholdNow(o)
    :: else -> skip
    fi
  }
}

/* take.lua on the other bucket, then give.lua on the home (with the take's
 * epoch) */
inline gather(h) {
  atomic {
    if
    :: meta[h] && stock[h] == 0 && stock[1 - h] > 0 && xunits == 0 ->
      stock[1 - h]--; xunits = 1; xfrom = 1 - h; xepoch = epochKey[1 - h]
    :: else -> skip
    fi
  };
  atomic {
    if
    :: xunits > 0 && xfrom == 1 - h ->
#ifndef BUG_GIVE_NO_EPOCH
      if
      :: epochKey[h] == xepoch -> stock[h] = stock[h] + xunits
      :: else -> skip   /* fenced: a rebuild set the stock from MySQL since */
      fi;
#else
      stock[h] = stock[h] + xunits;
#endif
      xunits = 0
    :: else -> skip
    fi
  }
}

/* the answer a keyed purchase gave its client */
inline answer(o, a) {
  if :: o < 2 -> kans[o] = a :: else -> skip fi
}

/* the answer of an admission undone (not replicated, or its hold lost): the
 * release's (waited); claimed means a replay of its key republished and
 * claimed it, and the order lives: 202 */
inline undone(o, rel) {
  if
  :: rel == 1 -> r202[o] = true; answer(o, o + 1)
  :: else -> r503[o] = true; answer(o, 100)
  fi
}

/* a replay's 202: the key's order as Redis has it; one that failed is
 * reported as failed (the body's status), which promises nothing */
inline replied(o, rid) {
  if
  :: rec[rid] == R_FAILED -> answer(o, 102)
  :: else -> r202[rid] = true; answer(o, rid + 1)
  fi
}

proctype Gateway(byte u; byte o; bool key) {
  byte res, rid, rel, seen, ws;
  bool ok;
  if :: o == 2 -> if :: gather(u) :: skip fi :: else -> skip fi;
  if
  :: o == 0 -> atomic { holdPhone(o, ok); ws = losses };
    if :: !ok -> r503[o] = true; answer(o, 100); goto done :: else -> skip fi;
    /* the hold waits for the replicas too; fewer: given back, 503 */
    if
    :: waited(ws)
    :: unhold(o, false); r503[o] = true; answer(o, 100); goto done
    fi
  :: else -> skip
  fi;
  if
  :: o == 3 ->
    /* the admission call times out: 503, release, and it runs after on
     * the same server (a Redis that lost its data since has lost the
     * connection, and the call with it: rueidis does not resend a write) */
    r503[o] = true; answer(o, 100);
    seen = losses;
    releaseW(o, rel, ws);
    atomic { if :: losses == seen -> admit(u, o, key, res, rid) :: else -> skip fi };
    goto done
  :: atomic { admit(u, o, key, res, rid); if :: res == A_OK -> pubs++ :: else -> skip fi; ws = losses }
  fi;
#ifndef NO_REPLICAS
  /* AdmitWait: an admission fewer replicas had within the wait is undone
   * and answered 503 (lua.ErrNotReplicated) */
  if
  :: res == A_OK ->
    if
    :: waited(ws)
    :: releaseW(o, rel, ws); undone(o, rel); pubs--; goto done
    fi
  :: else -> skip
  fi;
#endif
  if
  :: res == A_REPLAY ->
    if :: o == 0 -> unhold(o, false) :: else -> skip fi;
    /* the replay (gateway.replay): an unknown order is 503; a released one
     * is 503 once that is on the replicas (the gateway's release of it,
     * waited: it writes the released record again; a failover may have
     * brought the order back, pending, and then it is released now); a pending
     * one is published again (same message id) and claimed, which stops the
     * first request's release; then 202 */
    if
    :: atomic { rec[rid] == R_NONE -> r503[o] = true; answer(o, 100) }
    :: atomic { rec[rid] == R_RELEASED -> skip };
#ifndef BUG_REPLAY_NO_WAIT
      releaseW(rid, rel, ws);
      if
      :: rel == 1 -> r202[rid] = true; answer(o, rid + 1)
      :: else -> r503[o] = true; answer(o, 100)
      fi
#else
      r503[o] = true; answer(o, 100)
#endif
    :: atomic { rec[rid] != R_NONE && rec[rid] != R_RELEASED && rec[rid] != R_PENDING -> sync(); replied(o, rid) }
    :: atomic { rec[rid] == R_PENDING -> stream[rid] = true };
      atomic {
        if
        /* released meanwhile (gateway.replay's claim answers 'released'):
         * 503 as the code answers, without a second waited release; the
         * search finds no run where that release is lost and matters */
        :: rec[rid] == R_RELEASED || rec[rid] == R_NONE -> r503[o] = true; answer(o, 100)
        :: else ->
          if :: rec[rid] == R_PENDING -> rec[rid] = R_PROCESSING :: else -> skip fi;
          sync(); replied(o, rid)
        fi
      }
    fi;
    goto done
  :: res == A_COLD || res == A_DUPID -> r503[o] = true; answer(o, 100);
    if :: o == 0 -> unhold(o, false) :: else -> skip fi; goto done
  :: res == A_REFUSED -> answer(o, 101);
    if :: o == 0 -> unhold(o, false) :: else -> skip fi; goto done
  :: res == A_OK ->
    if
    :: o == 0 ->
      /* keep the hold; a hold gone (its master lost its data) counted the
       * charge nowhere: it is counted again as the order's (recount), and
       * the admission is undone and answered 503 (lua.ErrHoldLost) */
      atomic { ok = hold[o]; unhold(o, true) };
      if
      :: !ok ->
#ifndef BUG_HOLD_LOST
        atomic { if :: !held[o] -> held[o] = true; ph++ :: else -> skip fi };
        releaseW(o, rel, ws); undone(o, rel); pubs--; goto done
#else
        skip
#endif
      :: else -> skip
      fi
    :: else -> skip
    fi
  fi;
  /* publish: it lands; o0's may also be lost, land and time out, or its
   * gateway die before it; o2's may land and time out */
  if
  :: stream[o] = true; r202[o] = true; answer(o, o + 1)
  :: o == 0 -> releaseW(o, rel, ws);
    if :: rel == 1 -> r202[o] = true; answer(o, o + 1) :: else -> r503[o] = true; answer(o, 100) fi
  :: o == 0 || o == 2 -> stream[o] = true; releaseW(o, rel, ws);
    if :: rel == 1 -> r202[o] = true; answer(o, o + 1) :: else -> r503[o] = true; answer(o, 100) fi
  :: o == 0 -> skip   /* the gateway dies: no answer */
  fi;
  pubs--;
done:
  running--
}

/* the batch writer's transaction for order o; e: the epoch read after it */
inline decide(o, e) {
  lock();
  atomic {
#ifndef BUG_NO_CLAIM_EPOCH
    /* a rebuild since the claim (or a failover back to an older epoch): the
     * claim's answer is stale; nothing is decided, the message is claimed
     * again (e = 0: not decided) */
    if :: cep[o] != mepoch -> e = 0; goto undecided :: else -> skip fi;
#endif
    if
    :: st[o] == M_NONE ->
      if
      :: o < 2 && (st[1 - o] == M_CONFIRMED || st[1 - o] == M_CANCELED) -> st[o] = M_FAILED  /* the key's second order */
#ifndef BUG_TRUST_UNKNOWN
      /* an order Redis does not know, admitted since the last rebuild: no
       * admission of it survived (a failover lost it, or none was ever
       * made): failed, unadmitted */
      :: !(o < 2 && (st[1 - o] == M_CONFIRMED || st[1 - o] == M_CANCELED)) && unk[o] && aepoch[o] == cep[o] -> st[o] = M_FAILED
#endif
      :: else ->
        if
        :: sold < N && units[home(o)] < LIMIT -> st[o] = M_CONFIRMED; sold++; units[home(o)]++
        :: else -> st[o] = M_FAILED
        fi
      fi
    :: else -> skip
    fi;
    assert(sold <= N);
    e = mepoch;
undecided:
    skip
  };
  unlock()
}

/* confirm.lua, or release.lua in backend mode, with the epoch */
inline writeBack(o, e) {
  atomic {
    if
#ifndef BUG_NO_EPOCH
    :: epochKey[home(o)] != e -> skip   /* fenced: the rebuild counted it */
#endif
    :: else ->
      if
      :: st[o] == M_CONFIRMED || st[o] == M_CANCELED ->
        resv[o] = false;
        if :: st[o] == M_CONFIRMED -> rec[o] = R_CONFIRMED :: else -> rec[o] = R_CANCELED fi
      :: st[o] == M_FAILED ->
        if
        :: resv[o] && (rec[o] == R_PENDING || rec[o] == R_PROCESSING) ->
          resv[o] = false; stock[home(o)]++; ucount[home(o)]--;
          if :: home(o) == 0 -> unholdNow(o) :: else -> skip fi
        :: else -> skip
        fi;
        rec[o] = R_FAILED
      :: else -> skip
      fi
    fi
  }
}

/* the WAIT after a claim: cold (reused) becomes true when it failed */
inline claimWait(cold, ws) {
#if defined(NO_REPLICAS) || defined(BUG_CLAIM_NO_WAIT)
  skip
#else
  if
  :: waited(ws)
  :: cold = true
  fi
#endif
}

/* claim.lua, decide, write back, ack; drop a released one; on a cold tag
 * nothing (the message waits for the rebuild) */
inline handle(o, e, cold, ws, drop) {
  atomic {
    cold = !meta[home(o)] && !COLD;
    drop = !cold && rec[o] == R_RELEASED;   /* claim.lua's answer, kept */
    unk[o] = !cold && rec[o] == R_NONE;
    cep[o] = epochKey[home(o)];
    if :: !cold && rec[o] == R_PENDING -> rec[o] = R_PROCESSING :: else -> skip fi;
    ws = losses
  };
  if
  :: cold -> skip
  :: drop -> stream[o] = false
  :: else ->
    /* the claim is decided on only once the replicas have it; fewer: the
     * batch waits (lua.ErrNotReplicated is an outage) */
    claimWait(cold, ws);
    if
    :: !cold -> decide(o, e); if :: e != 0 -> writeBack(o, e); stream[o] = false :: else -> skip fi
    :: else -> skip
    fi
  fi
}

/* handle for the reconcile at the end, when the replicas answer */
inline handleDone(o, e, cold, drop) {
  atomic {
    cold = !meta[home(o)] && !COLD;
    drop = !cold && rec[o] == R_RELEASED;
    unk[o] = !cold && rec[o] == R_NONE;
    cep[o] = epochKey[home(o)];
    if :: !cold && rec[o] == R_PENDING -> rec[o] = R_PROCESSING :: else -> skip fi
  };
  if
  :: cold -> skip
  :: drop -> stream[o] = false
  :: else -> sync(); decide(o, e); if :: e != 0 -> writeBack(o, e); stream[o] = false :: else -> skip fi
  fi
}

/* The backends, as one consumer: a message is handled, or its handler dies
 * after MySQL decided it (no write-back, no ack: it is delivered again). */
proctype Backend() {
  byte o, e, ws;
  bool cold, drop;
  do
  :: running == 0 -> break
  /* claim.lua answers 'cold' while the order's tag is not warm: the
   * message waits for the rebuild */
  :: atomic { stream[0] && (meta[home(0)] || COLD) -> o = 0 }; handle(o, e, cold, ws, drop)
  :: atomic { stream[1] && (meta[home(1)] || COLD) -> o = 1 }; handle(o, e, cold, ws, drop)
  :: atomic { stream[2] && (meta[home(2)] || COLD) -> o = 2 }; handle(o, e, cold, ws, drop)
  :: atomic { stream[3] && (meta[home(3)] || COLD) -> o = 3 }; handle(o, e, cold, ws, drop)
  :: atomic { crashes > 0 && stream[0] && (meta[home(0)] || COLD) -> crashes--; o = 0 }; goto crash
  :: atomic { crashes > 0 && stream[2] && (meta[home(2)] || COLD) -> crashes--; o = 2 };
crash:
    atomic {
      cold = !meta[home(o)] && !COLD;
      drop = !cold && rec[o] == R_RELEASED;
      unk[o] = !cold && rec[o] == R_NONE;
      cep[o] = epochKey[home(o)];
      if :: !cold && rec[o] == R_PENDING -> rec[o] = R_PROCESSING :: else -> skip fi;
      ws = losses
    };
    if :: !cold && !drop -> claimWait(cold, ws) :: else -> skip fi;
    if :: !cold && !drop -> decide(o, e) :: else -> skip fi
  od
}

/* restock.lua with the epoch read after the cancel committed */
inline restock(o, e) {
  atomic {
    if
#ifndef BUG_NO_EPOCH
    :: epochKey[home(o)] != e -> skip
#endif
    :: else ->
      if
      :: restocked[o] -> skip
      :: !restocked[o] && rec[o] != R_NONE && rec[o] != R_FAILED && rec[o] != R_RELEASED ->
        stock[home(o)]++; resv[o] = false;
        if :: !kept[o] -> ucount[home(o)]-- :: else -> skip fi;
        if :: home(o) == 0 -> unholdNow(o) :: else -> skip fi;
        restocked[o] = true; rec[o] = R_CANCELED
      :: else -> restocked[o] = true; rec[o] = R_CANCELED
      fi
    fi
  }
}

/* The buyer's cancel keeps the buyer's quota for the rest of the sale (a
 * scalper cannot hand a unit to another account and buy again); an expiry
 * gives it back. Either is one transaction under the sale row lock, then the
 * restock with the epoch read in it. */
proctype Cancel(byte o) {
  byte e;
  bool did, expiry;
  if :: expiry = true :: expiry = false fi;
  lock();
  atomic {
    if
    :: st[o] == M_CONFIRMED ->
      st[o] = M_CANCELED; sold--; did = true;
      if :: expiry -> units[home(o)]-- :: else -> skip fi
    :: else -> skip
    fi;
    e = mepoch;
    kept[o] = !expiry
  };
  unlock();
  if :: did -> restock(o, e) :: else -> skip fi;
  running--
}

/* The one rebuild (backend/rebuild.go). */
proctype Rebuild() {
  byte e, p, i;
  bool pending[NO];
  bool lresv[NO];
  byte lrec[NO];
  bool lhold[NO];
  byte lidem;
  bool moved = true;
  do
  :: !moved -> break
  :: moved ->
    /* the sale row lock, a new epoch, the fence of every tag */
    atomic {
      !mlock -> mlock = true;
      mepoch++; e = mepoch;
      meta[0] = false; meta[1] = false; epochKey[0] = REBUILDING; epochKey[1] = REBUILDING
    };
#ifdef BUG_NO_ROWLOCK
    unlock();   /* the old warm read a snapshot without holding the row */
#endif
    /* what only Redis knows, and what is in flight: reserved or in the
     * stream, no MySQL row, not released */
    atomic {
      i = 0;
      do
      :: i < NO ->
        lresv[i] = resv[i]; lrec[i] = rec[i]; lhold[i] = hold[i];
        pending[i] = (resv[i] || stream[i]) && st[i] == M_NONE && rec[i] != R_RELEASED;
        i++
      :: else -> break
      od;
      lidem = idem
    };
    /* install: nothing kept from Redis moved, then everything in one step */
    atomic {
      moved = (epochKey[0] != REBUILDING || epochKey[1] != REBUILDING);
      i = 0;
      do
      :: i < NO -> if :: resv[i] != lresv[i] || rec[i] != lrec[i] || hold[i] != lhold[i] -> moved = true :: else -> skip fi; i++
      :: else -> break
      od;
      if
      :: !moved ->
        ucount[0] = units[0]; ucount[1] = units[1];
        p = N - sold;
        idem = 0; ph = 0;
        i = 0;
        do
        :: i < NO ->
          held[i] = false; hold[i] = false; resv[i] = false;
          if
          :: pending[i] ->
            resv[i] = true;
            if :: lrec[i] == R_PENDING -> rec[i] = R_PENDING :: else -> rec[i] = R_PROCESSING fi;
            p--;
#ifndef BUG_NO_INFLIGHT_CHARGES
            ucount[home(i)]++;
#endif
            /* the key of an order in flight, from its reservation or its
             * message, unless MySQL's order holds the key */
#ifndef BUG_STREAM_IDEM
            if :: i < 2 && st[1 - i] != M_CONFIRMED && st[1 - i] != M_CANCELED -> idem = i + 1 :: else -> skip fi;
#else
            /* the old refill: keys of orders in flight only if Redis kept them */
            if :: i < 2 && lidem == i + 1 -> idem = i + 1 :: else -> skip fi;
#endif
            if :: i == 0 -> held[i] = true; ph++ :: else -> skip fi
          :: !pending[i] && st[i] != M_NONE ->
#ifdef BUG_KEEP_DECIDED
            resv[i] = lresv[i];   /* the old rewarm left decided reservations */
#endif
            if
            :: st[i] == M_CONFIRMED -> rec[i] = R_CONFIRMED
            :: st[i] == M_FAILED -> rec[i] = R_FAILED
            :: st[i] == M_CANCELED -> rec[i] = R_CANCELED
            fi;
            /* the key of an order MySQL holds */
            if :: i < 2 && (st[i] == M_CONFIRMED || st[i] == M_CANCELED) -> idem = i + 1 :: else -> skip fi;
            if :: i == 0 && st[i] == M_CONFIRMED -> held[i] = true; ph++ :: else -> skip fi
          :: else ->
            /* a tombstone stays; an undecided hold stays, counted */
            if :: lrec[i] == R_RELEASED -> rec[i] = R_RELEASED :: else -> rec[i] = R_NONE fi;
            if :: lhold[i] -> hold[i] = true; ph++ :: else -> skip fi
          fi;
#ifndef BUG_NO_RESTOCKED
          restocked[i] = (st[i] == M_CANCELED);
#else
          restocked[i] = false;
#endif
          i++
        :: else -> break
        od;
        stock[0] = p - p / 2; stock[1] = p / 2;
        xunits = 0;
        epochKey[0] = e; epochKey[1] = e;
        meta[0] = true; meta[1] = true
      :: else -> skip
      fi;
      /* forget what was read (a smaller state) */
      i = 0;
      do
      :: i < NO -> lresv[i] = false; lrec[i] = 0; lhold[i] = false; pending[i] = false; i++
      :: else -> break
      od;
      lidem = 0; i = 0; p = 0;
#ifndef BUG_NO_ROWLOCK
      mlock = false
#else
      skip
#endif
    }
  od;
  rbusy = false
}

inline rebuildNow() {
  atomic { !rbusy -> rbusy = true; run Rebuild() };
  (!rbusy)
}

proctype Leader() {
  do
  :: rebuilds > 0 -> rebuilds--; rebuildNow()
  :: lost > 0 ->
#ifndef NO_REPLICAS
    /* a failover: the replica, with what the last successful WAIT covered,
     * becomes the master (the connections break: a call in flight is lost) */
    atomic { lost--; losses++; copyRedis(, r_); clearReplica() };
    /* the leader sees the master's replication id change and rebuilds every
     * sale of it (what the failover lost, e.g. an admission not yet
     * replicated whose message a replay published, is then counted from the
     * stream or MySQL), after the publish grace as for a loss */
    (pubs == 0);
#ifndef BUG_NO_FAILOVER_REBUILD
    rebuildNow()
#else
    if :: !warmTag(0) || !warmTag(1) -> rebuildNow() :: else -> skip fi
#endif
#else
    atomic {
      lost--; losses++;
      meta[0] = false; meta[1] = false; stock[0] = 0; stock[1] = 0; ucount[0] = 0; ucount[1] = 0;
      resv[0] = false; resv[1] = false; resv[2] = false; resv[3] = false;
      rec[0] = R_NONE; rec[1] = R_NONE; rec[2] = R_NONE; rec[3] = R_NONE;
      restocked[0] = false; restocked[1] = false; restocked[2] = false; restocked[3] = false;
      hold[0] = false; hold[1] = false; hold[2] = false; hold[3] = false;
      held[0] = false; held[1] = false; held[2] = false; held[3] = false;
      idem = 0; epochKey[0] = 0; epochKey[1] = 0; ph = 0; xunits = 0
    };
    /* a gateway meets the cold sale and asks for a warm; the warm waits one
     * publish timeout first (warmer.afterGrace): every publish of an
     * admission made before the loss has landed or failed by then */
    (pubs == 0);
    rebuildNow()
#endif
  :: running == 0 -> break
  od
}

init {
  byte o, e;
  bool cold, drop;
  lost = 1;
  rebuilds = 1;
  meta[0] = true; meta[1] = true; stock[0] = 1; stock[1] = 1; epochKey[0] = 1; epochKey[1] = 1;
  sync();
  /* The configurations (docs/verification.md); each is searched
   * exhaustively on its own: all of them at once is beyond a CI budget. */
#if defined(CFG_KEYS)
  running = 2;
  atomic {
    run Gateway(0, 0, true);
    run Gateway(0, 1, true);
    run Backend();
    run Leader()
  };
#elif defined(CFG_CANCEL)
  running = 3;
  atomic {
    run Gateway(1, 2, false);
    run Gateway(1, 3, false);
    run Cancel(2);
    run Backend();
    run Leader()
  };
#else
  running = 5;
  atomic {
    run Gateway(0, 0, true);
    run Gateway(0, 1, true);
    run Gateway(1, 2, false);
    run Gateway(1, 3, false);
    run Cancel(2);
    run Backend();
    run Leader()
  };
#endif
  (running == 0 && _nr_pr == 1);

  /* the leader's reconcile once the sale is quiet: a cold sale is rebuilt
   * first (the backends' messages wait for it) */
  if :: !warmTag(0) || !warmTag(1) -> rebuildNow() :: else -> skip fi;
  /* undecided holds past their grace (lua.FinishHolds, holdcheck.lua): an
   * order that was never admitted gets a tombstone and its hold back; one
   * that was keeps it as its count */
  o = 0;
  do
  :: o < NO ->
    atomic {
      if
      :: hold[o] && (rec[o] == R_NONE || rec[o] == R_RELEASED) -> rec[o] = R_RELEASED; hold[o] = false; ph--
      :: hold[o] && rec[o] != R_NONE && rec[o] != R_RELEASED -> hold[o] = false; held[o] = true
      :: else -> skip
      fi
    };
    o++
  :: else -> break
  od;
  o = 0;
  do
  :: o < NO ->
    if :: resv[o] && st[o] == M_NONE && !stream[o] -> stream[o] = true :: else -> skip fi;
    if :: stream[o] -> handleDone(o, e, cold, drop) :: else -> skip fi;
    /* a decided order whose write-back never landed (lost in a failover) */
    if :: resv[o] && st[o] != M_NONE -> e = mepoch; writeBack(o, e) :: else -> skip fi;
    o++
  :: else -> break
  od;
  if :: !warmTag(0) || !warmTag(1) -> rebuildNow() :: else -> skip fi;
  o = 0;
  do
  :: o < NO -> if :: st[o] == M_CANCELED -> e = mepoch; restock(o, e) :: else -> skip fi; o++
  :: else -> break
  od;

  /* 1, 2 */
  assert(sold <= N);
  assert(units[0] <= LIMIT && units[1] <= LIMIT);
  o = 0;
  do
  :: o < NO ->
#if !defined(NO_REPLICAS) || defined(PRICE)
    /* Without replicas, the loss of all of Redis's data has a price that
     * docs/recovery.md names: a 202 may fail and a 503 may become an order
     * (-DNO_REPLICAS -DPRICE shows it); every other assertion holds. */
    /* 3: a 202 is an order MySQL confirmed */
    assert(!r202[o] || st[o] == M_CONFIRMED || st[o] == M_CANCELED);
    /* 6: a 503 (and no 202 naming it) is no order */
    assert(!r503[o] || r202[o] || st[o] == M_NONE || st[o] == M_FAILED);
#endif
    o++
  :: else -> break
  od;
  /* 4: the key's 202s name one order; a retry is never refused over the
   * limit while the key's order lives */
  assert(!(kans[0] > 0 && kans[0] < 100 && kans[1] > 0 && kans[1] < 100) || kans[0] == kans[1]);
  assert(!(kans[1] == 101 && kans[0] > 0 && kans[0] < 100));
  assert(!(kans[0] == 101 && kans[1] > 0 && kans[1] < 100));
  /* 3, 9: the ledger and the counters, as MySQL has them */
  assert(stock[0] + stock[1] + resv[0] + resv[1] + resv[2] + resv[3] + sold == N);
  assert(ucount[0] == units[0] && ucount[1] == units[1]);
  assert(ph == (st[0] == M_CONFIRMED))
}
