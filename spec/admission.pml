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
 * (redelivery), and one may die after MySQL decided. Buyer 1 cancels o2 if it is confirmed (an expiry
 * is the same transaction). The leader may rebuild Redis (the one rebuild,
 * with its epoch) at any moment, and Redis may lose all its data once; the
 * gateway that meets the cold sale asks for a rebuild.
 *
 * When everything has ended, the leader reconciles (orphans republished and
 * written, a cold sale rebuilt, cancels restocked again), and then, with
 * DESIGN §2's numbers:
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
byte kans[2];          /* the keyed purchases' answers: o+1 (202), 100 (503), 101 (4xx) */

byte running;          /* purchases and the cancel, still under way */
byte lost;             /* Redis losses left */
byte losses;           /* Redis losses so far */
byte rebuilds;         /* spontaneous rebuilds left */
byte crashes = 1;      /* backend deaths left */
bool rbusy;            /* a rebuild is running */

#define home(o) ((o) / 2)   /* o0, o1: buyer 0; o2, o3: buyer 1 */

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
          stock[u]--; ucount[u]++; resv[o] = true; rec[o] = R_PENDING;
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
        if :: home(o) == 0 && idem == o + 1 -> idem = 0 :: else -> skip fi
      :: else -> skip
      fi;
      rec[o] = R_RELEASED; rel = 0
    fi
  }
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

proctype Gateway(byte u; byte o; bool key) {
  byte res, rid, rel, seen;
  bool ok;
  if :: o == 2 -> if :: gather(u) :: skip fi :: else -> skip fi;
  if
  :: o == 0 -> holdPhone(o, ok);
    if :: !ok -> r503[o] = true; answer(o, 100); goto done :: else -> skip fi
  :: else -> skip
  fi;
  if
  :: o == 3 ->
    /* the admission call times out: 503, release, and it runs after on
     * the same server (a Redis that lost its data since has lost the
     * connection, and the call with it: rueidis does not resend a write) */
    r503[o] = true; answer(o, 100);
    seen = losses;
    releaseGw(o, rel);
    atomic { if :: losses == seen -> admit(u, o, key, res, rid) :: else -> skip fi };
    goto done
  :: admit(u, o, key, res, rid)
  fi;
  if
  :: res == A_REPLAY -> r202[rid] = true; answer(o, rid + 1);
    if :: o == 0 -> unhold(o, false) :: else -> skip fi; goto done
  :: res == A_COLD || res == A_DUPID -> r503[o] = true; answer(o, 100);
    if :: o == 0 -> unhold(o, false) :: else -> skip fi; goto done
  :: res == A_REFUSED -> answer(o, 101);
    if :: o == 0 -> unhold(o, false) :: else -> skip fi; goto done
  :: res == A_OK -> if :: o == 0 -> unhold(o, true) :: else -> skip fi
  fi;
  /* publish: it lands; o0's may also be lost, land and time out, or its
   * gateway die before it; o2's may land and time out */
  if
  :: stream[o] = true; r202[o] = true; answer(o, o + 1)
  :: o == 0 -> releaseGw(o, rel);
    if :: rel == 1 -> r202[o] = true; answer(o, o + 1) :: else -> r503[o] = true; answer(o, 100) fi
  :: o == 0 || o == 2 -> stream[o] = true; releaseGw(o, rel);
    if :: rel == 1 -> r202[o] = true; answer(o, o + 1) :: else -> r503[o] = true; answer(o, 100) fi
  :: o == 0 -> skip   /* the gateway dies: no answer */
  fi;
done:
  running--
}

/* the batch writer's transaction for order o; e: the epoch read after it */
inline decide(o, e) {
  lock();
  atomic {
    if
    :: st[o] == M_NONE ->
      if
      :: sold < N && units[home(o)] < LIMIT -> st[o] = M_CONFIRMED; sold++; units[home(o)]++
      :: else -> st[o] = M_FAILED
      fi
    :: else -> skip
    fi;
    assert(sold <= N);
    e = mepoch
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

/* claim.lua, decide, write back, ack; drop a released one */
inline handle(o, e) {
  atomic { if :: rec[o] == R_PENDING -> rec[o] = R_PROCESSING :: else -> skip fi };
  if
  :: rec[o] == R_RELEASED -> stream[o] = false
  :: else -> decide(o, e); writeBack(o, e); stream[o] = false
  fi
}

/* The backends, as one consumer: a message is handled, or its handler dies
 * after MySQL decided it (no write-back, no ack: it is delivered again). */
proctype Backend() {
  byte o, e;
  do
  :: running == 0 -> break
  :: atomic { stream[0] -> o = 0 }; handle(o, e)
  :: atomic { stream[1] -> o = 1 }; handle(o, e)
  :: atomic { stream[2] -> o = 2 }; handle(o, e)
  :: atomic { stream[3] -> o = 3 }; handle(o, e)
  :: crashes > 0 && (stream[0] || stream[2]) ->
    crashes--;
    if :: stream[0] -> o = 0 :: else -> o = 2 fi;
    atomic { if :: rec[o] == R_PENDING -> rec[o] = R_PROCESSING :: else -> skip fi };
    if :: rec[o] != R_RELEASED -> decide(o, e) :: else -> skip fi
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
        stock[home(o)]++; ucount[home(o)]--; resv[o] = false;
        if :: home(o) == 0 -> unholdNow(o) :: else -> skip fi;
        restocked[o] = true; rec[o] = R_CANCELED
      :: else -> restocked[o] = true; rec[o] = R_CANCELED
      fi
    fi
  }
}

proctype Cancel(byte o) {
  byte e;
  bool did;
  lock();
  atomic {
    if
    :: st[o] == M_CONFIRMED -> st[o] = M_CANCELED; sold--; units[home(o)]--; did = true
    :: else -> skip
    fi;
    e = mepoch
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
#ifndef BUG_STREAM_IDEM
            if :: home(i) == 0 && lidem == i + 1 -> idem = i + 1 :: else -> skip fi;
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
            if :: home(i) == 0 && lidem == i + 1 && st[i] != M_FAILED -> idem = i + 1 :: else -> skip fi;
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
    rebuildNow()   /* a gateway meets the cold sale and asks for a warm */
  :: running == 0 -> break
  od
}

init {
  byte o, e;
  lost = 1;
  rebuilds = 1;
  meta[0] = true; meta[1] = true; stock[0] = 1; stock[1] = 1; epochKey[0] = 1; epochKey[1] = 1;
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
  (running == 0 && _nr_pr == 1);

  /* the leader's reconcile once the sale is quiet */
  o = 0;
  do
  :: o < NO ->
    if :: resv[o] && st[o] == M_NONE && !stream[o] -> stream[o] = true :: else -> skip fi;
    if :: stream[o] -> handle(o, e) :: else -> skip fi;
    o++
  :: else -> break
  od;
  if :: !meta[0] || !meta[1] -> rebuildNow() :: else -> skip fi;
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
    /* 3: a 202 is an order MySQL confirmed */
    assert(!r202[o] || st[o] == M_CONFIRMED || st[o] == M_CANCELED);
    /* 6: a 503 (and no 202 naming it) is no order */
    assert(!r503[o] || r202[o] || st[o] == M_NONE || st[o] == M_FAILED);
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
