-- wrk script of `make bench-edge` (scripts/bench-edge.sh): the same purchase request against
-- every target. Environment: WRK_TOKEN (a buyer's JWT, required); WRK_COUNT_STATUS=1 also counts
-- the answers by status (a Lua call per response: slower, so only for the warm-up check) and
-- prints "statuses: 409=N ..." at the end.
local token = os.getenv("WRK_TOKEN")
if token == nil or token == "" then
  io.stderr:write("wrk-purchase.lua: WRK_TOKEN is not set\n")
  os.exit(2)
end

wrk.method = "POST"
wrk.body = '{"quantity":1}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. token

if os.getenv("WRK_COUNT_STATUS") == "1" then
  local threads = {}

  function setup(thread)
    table.insert(threads, thread)
  end

  function init(args)
    statuses = {}
  end

  function response(status, headers, body)
    statuses[status] = (statuses[status] or 0) + 1
  end

  function done(summary, latency, requests)
    local total = {}
    for _, t in ipairs(threads) do
      for code, n in pairs(t:get("statuses")) do
        total[code] = (total[code] or 0) + n
      end
    end
    local codes = {}
    for code in pairs(total) do table.insert(codes, code) end
    table.sort(codes)
    local parts = {}
    for _, code in ipairs(codes) do table.insert(parts, code .. "=" .. total[code]) end
    io.write("statuses: " .. table.concat(parts, " ") .. "\n")
  end
end
