-- Integers as the decimal text every shardkeep writer stores (an i64 printed by Rust: an
-- optional '-', no leading zeros). Stored fences are compared as that text, never through
-- tonumber: Lua numbers are doubles, so tonumber reads 'inf', '1e300', '0x10' and ' 7 ' as
-- numbers and loses precision past 2^53. Prepended to the scripts that compare stored fences.
local I64_MAX, I64_MIN_DIGITS = '9223372036854775807', '9223372036854775808'

-- `text` when it is a canonical i64, else nil.
local function canon_int(text)
  if type(text) ~= 'string' then
    return nil
  end
  local sign, digits = string.match(text, '^(%-?)(%d+)$')
  if not digits or #digits > 19 or (#digits > 1 and string.sub(digits, 1, 1) == '0') then
    return nil
  end
  if sign == '-' and digits == '0' then
    return nil
  end
  if #digits == 19 and digits > (sign == '-' and I64_MIN_DIGITS or I64_MAX) then
    return nil
  end
  return text
end

-- -1, 0 or 1 as canonical integers `a` is below, equal to or above `b`.
local function cmp_int(a, b)
  local a_neg, b_neg = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if a_neg ~= b_neg then
    return a_neg and -1 or 1
  end
  local da, db = a, b
  if a_neg then
    da, db = string.sub(a, 2), string.sub(b, 2)
  end
  local c = 0
  if #da ~= #db then
    c = #da < #db and -1 or 1
  elseif da ~= db then
    c = da < db and -1 or 1
  end
  return a_neg and -c or c
end
