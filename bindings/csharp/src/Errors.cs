using System;
using System.Runtime.InteropServices;
using System.Text;

namespace H2o
{
    /// <summary>h2o status codes (h2o_status). A newer library may return a code not named here: the
    /// exception then carries it as an unnamed Status value (see H2oException.Code).</summary>
    public enum Status
    {
        /// <summary>Success.</summary>
        Ok = 0,
        /// <summary>A null handle, a bad parameter or a struct_size mismatch.</summary>
        InvalidArgument = 1,
        /// <summary>An allocation failed; nothing was changed.</summary>
        OutOfMemory = 2,
        /// <summary>A file could not be opened, mapped or read.</summary>
        Io = 3,
        /// <summary>The model file is malformed, truncated or inconsistent.</summary>
        ModelFormat = 4,
        /// <summary>Well-formed, but of an architecture or type this library does not run.</summary>
        Unsupported = 5,
        /// <summary>The session's KV cache cannot take more tokens.</summary>
        ContextFull = 6,
        /// <summary>The requested backend or device is not present.</summary>
        BackendUnavailable = 7,
        /// <summary>Text is not valid UTF-8.</summary>
        InvalidText = 8,
        /// <summary>An output buffer was too small (the binding retries with the needed size).</summary>
        BufferTooSmall = 9,
        /// <summary>The tokenizer could not be built or failed.</summary>
        Tokenizer = 10,
        /// <summary>A bug in h2o: please report it with the message.</summary>
        Internal = 11,
        /// <summary>Session.Cancel() or a progress callback stopped the call.</summary>
        Cancelled = 12,
        /// <summary>A saved session state is malformed, truncated or foreign.</summary>
        StateFormat = 13,
        /// <summary>The compute device failed while running; Session.Reset() recovers.</summary>
        BackendFailed = 14,
    }

    /// <summary>A failed h2o call: its status and the library's message.</summary>
    public class H2oException : Exception
    {
        /// <summary>What went wrong (an unnamed value for a code newer than this binding).</summary>
        public Status Status { get; }
        /// <summary>The status as the library's integer code.</summary>
        public int Code => (int)Status;

        /// <summary>An error of the given status, with the library's message.</summary>
        public H2oException(Status status, string message)
            : base(StatusName(status) + ": " + message)
        {
            Status = status;
            LibraryMessage = message;
        }

        /// <summary>The message as h2o wrote it, without the status name.</summary>
        public string LibraryMessage { get; }

        /// <summary>The library's name of a status, e.g. "invalid argument".</summary>
        public static string StatusName(Status status) => Utf8.FromNative(Native.h2o_status_string((int)status));
    }

    /// <summary>A C call that writes text the h2o way (capacity 0 asks for the size).</summary>
    internal delegate int TextCall(byte[] text, UIntPtr capacity, out UIntPtr needed);

    internal static class Utf8
    {
        /// <summary>The text a TextCall writes: its size asked first, then written.</summary>
        internal static string Out(TextCall call)
        {
            int code = call(null, UIntPtr.Zero, out UIntPtr needed);
            if (code != 0 && code != Native.BufferTooSmall) Check.Status(code);
            var text = new byte[(int)needed + 1];
            Check.Status(call(text, (UIntPtr)text.Length, out needed));
            return Encoding.UTF8.GetString(text, 0, (int)needed);
        }

        /// <summary>UTF-8 bytes without a terminator (text passed with its length).</summary>
        internal static byte[] Bytes(string text) => Encoding.UTF8.GetBytes(text ?? throw new ArgumentNullException());

        /// <summary>UTF-8 bytes with a NUL terminator (paths and names); a NUL inside is refused as
        /// h2o refuses a bad argument.</summary>
        internal static byte[] CString(string what, string text)
        {
            if (text == null) throw new ArgumentNullException(what);
            if (text.IndexOf('\0') >= 0) throw new H2oException(Status.InvalidArgument, what + " contains a NUL character");
            return Encoding.UTF8.GetBytes(text + "\0");
        }

        internal static string FromNative(IntPtr p, int length)
        {
            if (p == IntPtr.Zero || length == 0) return "";
            var bytes = new byte[length];
            Marshal.Copy(p, bytes, 0, length);
            return Encoding.UTF8.GetString(bytes);
        }

        internal static unsafe string FromNative(IntPtr p)
        {
            if (p == IntPtr.Zero) return "";
            int n = 0;
            while (((byte*)p)[n] != 0) n++;
            return FromNative(p, n);
        }
    }

    internal static class Check
    {
        /// <summary>Throws for a failed status, with the thread's last message.</summary>
        internal static void Status(int code)
        {
            if (code != 0) throw new H2oException((Status)code, Utf8.FromNative(Native.h2o_last_error()));
        }
    }
}
